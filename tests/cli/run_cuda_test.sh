#!/usr/bin/env bash
# `shardscope run --backend cuda` where it cannot run: without a driver or a device (CI), or in
# a build without the CUDA backend, it exits 2 with a message saying which, and writes nothing.
# Its option errors (--warmup 0) come first, on every machine.
# On a machine with a GPU the no-device path cannot be reached: the test reports itself skipped
# (exit 77; scripts/gpu/validate_runtime.sh covers that machine).
#
# Usage: run_cuda_test.sh path/to/shardscope   (from the repository root)
set -euo pipefail

shardscope=$(realpath "$1")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# At least one warm-up step: the first step on a GPU loads modules lazily and connects NCCL
# peers. Refused before any device is looked for, so this runs on every machine.
set +e
"$shardscope" run examples/tiny-fsdp2-2gpu.yaml --backend cuda --warmup 0 -o "$work/out3" > /dev/null 2> "$work/stderr3"
rc=$?
set -e
[ "$rc" -eq 2 ] || fail "--warmup 0 with --backend cuda: expected exit 2, got $rc"
grep -q -- "--warmup 0 with --backend cuda: expected at least 1 warm-up step" "$work/stderr3" ||
  fail "--warmup 0 message: $(cat "$work/stderr3")"
[ ! -e "$work/out3" ] || fail "--warmup 0 created the output directory"

set +e
"$shardscope" run examples/tiny-fsdp2-2gpu.yaml --backend cuda -o "$work/out" > "$work/stdout" 2> "$work/stderr"
rc=$?
set -e
message=$(cat "$work/stderr")
if [ "$rc" -eq 0 ] || grep -q "^shardscope: running" "$work/stderr"; then
  echo "SKIP: a CUDA device is present (run exited $rc); the no-device path needs a machine without one"
  exit 77
fi
[ "$rc" -eq 2 ] || fail "expected exit 2, got $rc: $message"
if ! grep -Eq "^shardscope: error: (no CUDA device: .+|--backend cuda: this build has no CUDA backend)" "$work/stderr"; then
  fail "expected 'no CUDA device: <cuda error>' or 'this build has no CUDA backend', got: $message"
fi
[ ! -e "$work/out" ] || fail "the output directory was created: $(ls -R "$work/out")"
[ ! -s "$work/stdout" ] || fail "unexpected output on stdout: $(cat "$work/stdout")"

# --cuda-graph belongs to the CUDA backend.
set +e
"$shardscope" run examples/tiny-fsdp2-2gpu.yaml --cuda-graph -o "$work/out2" > /dev/null 2> "$work/stderr2"
rc=$?
set -e
[ "$rc" -eq 2 ] || fail "--cuda-graph with the host backend: expected exit 2, got $rc"
grep -q -- "--cuda-graph needs --backend cuda" "$work/stderr2" || fail "--cuda-graph message: $(cat "$work/stderr2")"
[ ! -e "$work/out2" ] || fail "--cuda-graph error created the output directory"

if [ "$failures" -gt 0 ]; then exit 1; fi
echo "run --backend cuda without a device: ok ($message)"
