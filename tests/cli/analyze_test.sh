#!/usr/bin/env bash
# `shardscope analyze` on the real traces in tests/fixtures/real/traces/: HTA's figures for
# them (each folder's README.md) within 0.5 percentage points, the JSON shape, gzip and
# schemaVersion 1 files, our own simulate trace; bad inputs exit 2 with the file named.
set -uo pipefail
bin=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL $1"; failures=$((failures + 1)); }
real=tests/fixtures/real/traces

out=$("$bin" analyze "$real/hta-resnet-ddp-a100/nccl_data.json.gz" \
        "$real/hta-recsys-2-of-128-ranks/sampled_rank-0.json.gz" "$real/hta-recsys-2-of-128-ranks/sampled_rank-1.json.gz" 2>&1)
code=$?
# nccl_data is rank 0 of its job and so is sampled_rank-0: two files of one rank.
[ "$code" -eq 2 ] || fail "two files of rank 0: exit $code, expected 2: $out"
grep -q "rank 0 is also the rank of" <<<"$out" || fail "two files of rank 0: message: $out"

"$bin" analyze "$real/hta-recsys-2-of-128-ranks/sampled_rank-0.json.gz" \
  "$real/hta-recsys-2-of-128-ranks/sampled_rank-1.json.gz" --json -o "$work/recsys.json" > /dev/null 2>&1 ||
  fail "analyze recsys --json"
"$bin" analyze "$real/hta-resnet-ddp-a100/nccl_data.json.gz" --json > "$work/nccl.json" 2> "$work/nccl.err" || fail "analyze nccl_data"
/usr/bin/python3 - "$work/nccl.json" "$work/recsys.json" <<'PY' || fail "HTA figures"
import json, sys
# HTA's own figures (tests/fixtures/real/traces/*/README.md): idle, compute, non-compute, overlap.
expected = {("nccl", 0): (77.78, 17.26, 4.97, 14.31),
            ("recsys", 0): (53.56, 17.71, 28.74, 11.81),
            ("recsys", 1): (54.72, 22.57, 22.72, 20.05)}
ok = True
for name, path in (("nccl", sys.argv[1]), ("recsys", sys.argv[2])):
    for r in json.load(open(path))["ranks"]:
        want = expected[(name, r["rank"])]
        got = (r["idle_pct"], r["compute_pct"], r["non_compute_pct"], r["comm_comp_overlap_pct"])
        if any(abs(a - b) > 0.5 for a, b in zip(got, want)):
            print(f"  {name} rank {r['rank']}: got {got}, HTA {want}"); ok = False
        for s in r["streams"]:
            keys = {"stream", "idle_pct", "host_wait_ns", "host_wait_pct", "kernel_wait_ns", "kernel_wait_pct",
                    "other_ns", "other_pct"}
            if not keys <= set(s):
                print("  stream keys missing:", keys - set(s)); ok = False
            if s["idle_ns"] > r["span_ns"]:
                print(f"  {name} rank {r['rank']} stream {s['stream']}: idle exceeds the span"); ok = False
        if not r["kernel_types"]:
            print("  no kernel types"); ok = False
sys.exit(0 if ok else 1)
PY

out=$("$bin" analyze "$real/kineto-resnet50-v100/worker0.1623143089861.pt.trace.json.gz" 2>&1)
[ $? -eq 0 ] || fail "schemaVersion 1 trace: $out"
grep -q "6 ProfilerStep(s), last excluded" <<<"$out" || fail "schemaVersion 1 trace: steps: $out"

"$bin" simulate examples/tiny-fsdp2-2gpu.yaml -q -o "$work/sim" > /dev/null 2>&1 || fail "simulate"
out=$("$bin" analyze "$work/sim" 2>&1)
[ $? -eq 0 ] || fail "analyze a simulate trace: $out"
grep -q "no ProfilerStep: all events" <<<"$out" || fail "analyze a simulate trace: $out"

printf '\x1f\x8b\x08\x00' > "$work/cut.json.gz"
out=$("$bin" analyze "$work/cut.json.gz" 2>&1)
[ $? -eq 2 ] || fail "corrupt gzip: expected exit 2: $out"
grep -q "cut.json.gz: truncated gzip data" <<<"$out" || fail "corrupt gzip: message: $out"
"$bin" analyze "$work/absent.json" > /dev/null 2>&1
[ $? -eq 2 ] || fail "missing file: expected exit 2"

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "analyze: all checks passed"
