#!/usr/bin/env bash
# Same input, same output, byte for byte, across processes: each plan is simulated by two
# separate processes whose address-space layout and environment differ (one with ASLR off
# through setarch -R where the kernel allows it, and glibc's MALLOC_PERTURB_ filling freed and
# fresh heap memory with a pattern, so a read of uninitialised or freed memory shows; the
# other with ASLR on, a different locale and extra environment), and every file each writes
# (report.json, trace.json, Flight Recorder dumps, memory snapshots) must hash the same. The
# in-process test (tests/integration_test.cc) cannot see what differs between processes:
# pointer values, hash seeds, uninitialised memory, the environment.
set -euo pipefail
bin=$(realpath "$1")
cd "$(dirname "$0")/../.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
# A plan per kind of output: a completed step (trace, snapshots), a hang (Flight Recorder
# dumps, the wait-for graph), divergence variants (several programs), and an OOM agreement.
plans=(examples/tiny-fsdp2-2gpu.yaml examples/divergence/ddp-bucket-layout.yaml examples/divergence/straggler.yaml
       examples/composer-oom/sync-hooks.yaml)
no_aslr=()
if setarch "$(uname -m)" -R true 2>/dev/null; then no_aslr=(setarch "$(uname -m)" -R); fi
for plan in "${plans[@]}"; do
  name=$(basename "$plan" .yaml)
  env -i PATH="$PATH" HOME="$HOME" MALLOC_PERTURB_=165 LC_ALL=C "${no_aslr[@]}" \
    "$bin" simulate -q "$plan" -o "$work/$name-a" > "$work/$name-a.txt"
  env PATH="$PATH" LC_ALL=C.UTF-8 SHARDSCOPE_UNRELATED_VARIABLE=$RANDOM$RANDOM TZ=Pacific/Chatham \
    "$bin" simulate -q "$plan" -o "$work/$name-b" > "$work/$name-b.txt"
  (cd "$work/$name-a" && sha256sum $(ls | sort)) > "$work/$name-a.sha"
  (cd "$work/$name-b" && sha256sum $(ls | sort)) > "$work/$name-b.sha"
  if ! diff "$work/$name-a.sha" "$work/$name-b.sha" > "$work/$name.diff"; then
    echo "$plan: two processes wrote different files:"; cat "$work/$name.diff"; status=1
  fi
  # The summary on stdout too, but for the output folder it names.
  if ! diff <(sed "s|$work/$name-a|DIR|g" "$work/$name-a.txt") <(sed "s|$work/$name-b|DIR|g" "$work/$name-b.txt"); then
    echo "$plan: two processes printed different summaries"; status=1
  fi
  # Something was written and hashed: the comparison is not of two empty lists.
  [ "$(wc -l < "$work/$name-a.sha")" -ge 2 ] || { echo "$plan: fewer than two output files"; status=1; }
done
[ $status -eq 0 ] && echo "${#plans[@]} plans: two processes (ASLR ${no_aslr:+off/}on, different environments) wrote identical files"
exit $status
