#!/usr/bin/env bash
# `shardscope check`: on the tiny FSDP2 plan every OOM at a module boundary hangs the other
# rank (exit 1, a table row naming the collective it waits in), the straggler is safe and
# costs step time, a rank-dependent prefetch hangs; a bad input exits 2; `simulate
# --straggler` reports the straggler's cost.
set -uo pipefail
bin=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL $1"; failures=$((failures + 1)); }

out=$("$bin" check examples/tiny-fsdp2-2gpu.yaml --threads 2 2>"$work/err")
code=$?
[ "$code" -eq 1 ] || fail "check tiny: exit $code, expected 1: $out $(cat "$work/err")"
grep -Eq "^OOM rank 0 @ forward mb 0 embed \(op [0-9]+\) +hang +watchdog [0-9.]+ s +- +rank 1 waits in all_gather #1 on 'dp_shard' for rank 0$" <<<"$out" ||
  fail "check tiny: no hang row for the first forward boundary: $out"
grep -Eq "^straggler rank 0 x2 +ok +[0-9.]+ ms +\+[0-9.]+ ms$" <<<"$out" || fail "check tiny: no straggler row: $out"
# One rank without backward prefetch reorders the fifth collective on 'dp_shard' (sim/plan/src/
# divergence_test.cc derives #5); longer sequences and 1 GiB held elsewhere are safe.
grep -Eq "^rank 0 runs fsdp2.backward_prefetch 0 +hang +watchdog [0-9.]+ s +- +rank 0 is in reduce_scatter #5 on 'dp_shard' .* while rank 1 is in all_gather #5 on 'dp_shard'" <<<"$out" ||
  fail "check tiny: no prefetch divergence row: $out"
grep -Eq "^rank 0 runs seq_len x1.5 \(training.seq_len 192\) +ok" <<<"$out" || fail "check tiny: no seq_len row: $out"
grep -Eq "^rank 0: 1.00 GiB held by another process +ok" <<<"$out" || fail "check tiny: no memory-held row: $out"
grep -q "9 of 12 fault(s) hang" <<<"$out" || fail "check tiny: no verdict: $out"
# Deterministic: the same table with one thread.
out1=$("$bin" check examples/tiny-fsdp2-2gpu.yaml --threads 1 2>/dev/null)
[ "$out" == "$out1" ] || fail "check tiny: output depends on --threads"

"$bin" check "$work/does-not-exist.yaml" >/dev/null 2>&1
code=$?
[ "$code" -eq 2 ] || fail "check missing plan: exit $code, expected 2"
"$bin" check examples/tiny-fsdp2-2gpu.yaml --straggler 7:2 >/dev/null 2>&1
code=$?
[ "$code" -eq 2 ] || fail "check bad straggler: exit $code, expected 2"
"$bin" check examples/tiny-fsdp2-2gpu.yaml --ranks 0-9 >/dev/null 2>&1
code=$?
[ "$code" -eq 2 ] || fail "check bad ranks: exit $code, expected 2"

out=$("$bin" simulate examples/tiny-fsdp2-2gpu.yaml -q --trace-ranks none -o "$work/sim" --straggler 1:3 2>&1)
code=$?
[ "$code" -eq 0 ] || fail "simulate --straggler: exit $code: $out"
grep -Eq "DIVERGENCE: rank 1 \(kernels and copies x3\): step [0-9.]+ ms, [0-9.]+ ms with every rank alike: costs \+[0-9.]+ ms" <<<"$out" ||
  fail "simulate --straggler: no cost line: $out"

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "all check tests passed"
