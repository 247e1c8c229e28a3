#!/usr/bin/env bash
# `shardscope import` turns the hand-written 2-rank Kineto fixtures into one measured trace;
# `shardscope calibrate` fits a profile to a simulated trace of the tiny example and a plan
# that names the profile simulates with it; `shardscope diff` of the imported trace with
# itself reports no error. Bad inputs exit 2.
set -uo pipefail
bin=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL $1"; failures=$((failures + 1)); }

out=$("$bin" import tests/fixtures/kineto/rank0.pt.trace.json tests/fixtures/kineto/rank1.pt.trace.json -o "$work/imported" 2>&1)
code=$?
[ "$code" -eq 0 ] || fail "import: exit $code: $out"
[ -s "$work/imported/trace.json" ] || fail "import: no trace.json"
grep -q "2 rank(s), world size 2" <<<"$out" || fail "import: no rank summary: $out"
grep -Eq "group '0': size 2, ranks \[0, 1\].*all_gather 2, reduce_scatter 2" <<<"$out" || fail "import: no process group line: $out"
/usr/bin/python3 - "$work/imported/trace.json" <<'PY' || fail "import: trace content"
import json, sys
t = json.load(open(sys.argv[1]))
pids = {e["pid"] for e in t["traceEvents"] if e.get("ph") == "X"}
assert pids == {0, 1}, pids
colls = [e for e in t["traceEvents"] if e.get("ph") == "X" and "Collective name" in e.get("args", {}) and e.get("cat") == "kernel"]
assert len(colls) == 4, len(colls)
PY

"$bin" import "$work/does-not-exist.json" -o "$work/bad" >/dev/null 2>&1
code=$?
[ "$code" -eq 2 ] || fail "import missing file: exit $code, expected 2"

# diff of the imported trace with itself: every op matched, no error.
out=$("$bin" diff "$work/imported" "$work/imported" -o "$work/selfdiff" 2>&1)
code=$?
[ "$code" -eq 0 ] || fail "diff imported with itself: exit $code: $out"

# calibrate: fit to a simulated trace of the tiny example (every rank traced).
"$bin" schedule examples/tiny-fsdp2-2gpu.yaml -o "$work/schedule.json" >/dev/null 2>&1 || fail "schedule"
"$bin" simulate "$work/schedule.json" -q --trace-ranks all -o "$work/sim" >/dev/null 2>&1 || fail "simulate"
out=$("$bin" calibrate "$work/sim/trace.json" --schedule "$work/schedule.json" -o "$work/profile.yaml" 2>&1)
code=$?
[ "$code" -eq 0 ] || fail "calibrate: exit $code: $out"
[ -s "$work/profile.yaml" ] || fail "calibrate: no profile"
# The simulator's own trace gives back its launch cost (host.launch_overhead_us 2.7).
grep -Eq "launch_overhead_ns:.*2700" "$work/profile.yaml" || fail "calibrate: launch cost not recovered: $(cat "$work/profile.yaml")"

# A plan that names the profile (relative to the plan's folder) simulates with it.
sed 's/^cluster:$/cluster:\n  calibration: profile.yaml/' examples/tiny-fsdp2-2gpu.yaml > "$work/calibrated.yaml"
grep -q "calibration: profile.yaml" "$work/calibrated.yaml" || fail "test setup: no calibration key"
out=$("$bin" simulate "$work/calibrated.yaml" -q -o "$work/calsim" 2>&1)
code=$?
[ "$code" -eq 0 ] || fail "simulate calibrated plan: exit $code: $out"
# ... and says so, in the summary and in report.json.
"$bin" simulate "$work/calibrated.yaml" -o "$work/calsim2" >"$work/calsim2.txt" 2>&1 || fail "simulate calibrated plan (summary)"
grep -q "costs calibrated by .*profile.yaml: " "$work/calsim2.txt" || fail "calibrated summary: no profile line: $(cat "$work/calsim2.txt")"
/usr/bin/python3 - "$work/calsim2/report.json" "$work/sim/report.json" <<'PY' || fail "report.json calibration key"
import json, sys
c = json.load(open(sys.argv[1]))["calibration"]
assert c["profile"].endswith("profile.yaml") and c["launch_overhead"] is True, c
assert json.load(open(sys.argv[2]))["calibration"] is None
PY

# Traces that are not runs of the schedule are refused (exit 2, named), nothing written.
"$bin" simulate examples/small-fsdp2-8gpu.yaml -q --trace-ranks 0 -o "$work/other" >/dev/null 2>&1 || fail "simulate other"
out=$("$bin" calibrate "$work/other/trace.json" --schedule "$work/schedule.json" -o "$work/p2.yaml" 2>&1)
code=$?
[ "$code" -eq 2 ] || fail "calibrate with an 8-rank trace: exit $code, expected 2: $out"
grep -q "world_size is 8, the schedule has 2 ranks" <<<"$out" || fail "calibrate world size: $out"
[ ! -e "$work/p2.yaml" ] || fail "calibrate world size: profile written"
# Measured on another GPU (report.json beside the trace says so).
cp -r "$work/sim" "$work/othergpu"
sed -i 's/"gpu": "[^"]*"/"gpu": "v100-sxm2-32gb"/' "$work/othergpu/report.json"
out=$("$bin" calibrate "$work/othergpu/trace.json" --schedule "$work/schedule.json" -o "$work/p3.yaml" 2>&1)
code=$?
[ "$code" -eq 2 ] || fail "calibrate on another GPU: exit $code, expected 2: $out"
grep -q "measured with GPU preset v100-sxm2-32gb" <<<"$out" || fail "calibrate other GPU message: $out"
[ ! -e "$work/p3.yaml" ] || fail "calibrate other GPU: profile written"

# alloc-trace takes the plan's GPU capacity (what simulate's report calls capacity_bytes).
"$bin" alloc-trace examples/tiny-fsdp2-2gpu.yaml --rank 0 -o "$work/alloc.json" >/dev/null 2>&1 || fail "alloc-trace"
/usr/bin/python3 - "$work/alloc.json" "$work/sim/report.json" <<'PY' || fail "alloc-trace capacity"
import json, sys
trace = json.load(open(sys.argv[1]))
ranks = json.load(open(sys.argv[2]))["ranks"]
cap = [r for r in ranks if r["rank"] == 0][0]["capacity_bytes"]
assert trace["device_memory_bytes"] == cap, (trace["device_memory_bytes"], cap)
PY
# A missing profile is bad input, named at its key.
sed 's/^cluster:$/cluster:\n  calibration: missing.yaml/' examples/tiny-fsdp2-2gpu.yaml > "$work/missing.yaml"
out=$("$bin" simulate "$work/missing.yaml" -q -o "$work/missing" 2>&1)
code=$?
[ "$code" -eq 2 ] || fail "missing profile: exit $code, expected 2: $out"
grep -q "cluster.calibration" <<<"$out" || fail "missing profile: message does not name the key: $out"

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "all import/calibrate tests passed"
