#!/usr/bin/env bash
# The predict -> measure -> diff -> calibrate -> predict loop on one GPU (docs/VALIDATION.md,
# "Profile, diff and calibration loop"; issue 7's targets):
#   1. a training plan and a held-out plan, each cut to 2 layers on 1 GPU;
#   2. simulate both; run both with `run --backend cuda --profile` (CUPTI); diff each;
#   3. calibrate on the training plan's measured trace only;
#   4. simulate both again with `cluster: {calibration: profile.yaml}` and diff again;
#   5. the profiling overhead: the training plan run with and without --profile.
# Targets after calibration: step-time error <= 3%, median per-op error <= 5% (diff's
# report.json device_ops.median_abs_relative_error), profiling overhead <= 2%, zero dropped
# CUPTI records. Prints one table; exits non-zero when a target is missed or a step fails.
#
# Needs what scripts/gpu/validate_runtime.sh needs (GPU + driver, CUDA toolkit with cuBLASLt,
# NCCL and CUPTI, cmake, ninja, g++ >= 12, Open MPI, python3 with PyYAML).
# Usage: OUT=DIR scripts/gpu/validate_profile_loop.sh [TRAIN.yaml [HELDOUT.yaml]]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=build-validate-runtime
results=${OUT:-$build/profile-loop}
mkdir -p "$results"
train_plan=${1:-examples/llama3-8b-fsdp2-64xa100.yaml}
heldout_plan=${2:-examples/grad-accum/last-micro-batch.yaml}
failures=0
fail() { echo "FAIL: $*" | tee -a "$results/failures.txt"; failures=$((failures + 1)); }

{ nvidia-smi || true; /usr/local/cuda/bin/nvcc --version || true; } > "$results/environment.txt" 2>&1
echo "== build (Release, CUDA ON)"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSHARDSCOPE_CUDA=ON -DSHARDSCOPE_BENCH=OFF > "$results/cmake.log"
ninja -C "$build" ${JOBS:+-j"$JOBS"} shardscope > "$results/build.log"
bin=$(realpath "$build/bin/shardscope")

# A plan cut to 2 layers on one GPU (the same override validate_runtime.sh uses), plus an
# optional calibration profile given relative to the cut plan's folder.
cut_plan() {  # SOURCE DEST [PROFILE]
  python3 - "$@" <<'PY'
import sys, yaml
plan = yaml.safe_load(open(sys.argv[1]))
plan.pop("divergence", None)
for key, override in (("model", {"layers": 2}), ("cluster", {"nodes": 1, "gpus_per_node": 1})):
    value = plan.get(key)
    value = {"preset": value} if isinstance(value, str) else dict(value or {})
    value.update(override)
    plan[key] = value
if len(sys.argv) > 3:
    plan["cluster"]["calibration"] = sys.argv[3]
yaml.safe_dump(plan, open(sys.argv[2], "w"), sort_keys=False)
PY
}

# Reads a diff's report.json: step error (relative) and the median per-op error.
diff_figures() {  # REPORT.json -> "step_error median_op_error p90_op_error"
  python3 - "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
step = r["step"]
err = abs(step["difference_ns"]) / step["predicted_ns"] if step["predicted_ns"] else float("inf")
ops = r["device_ops"]
print(f'{err:.4f} {ops["median_abs_relative_error"]:.4f} {ops["p90_abs_relative_error"]:.4f}')
PY
}

run_measured() {  # PLAN DIR [--profile]
  timeout 900 "$bin" run "$1" --backend cuda -o "$2" --warmup 2 --steps 5 --timeout 300 "${@:3}" > "$2.log" 2>&1
}

for which in train heldout; do
  source_plan=$train_plan
  [ "$which" = heldout ] && source_plan=$heldout_plan
  cut_plan "$source_plan" "$results/$which.yaml"
  "$bin" simulate "$results/$which.yaml" -q --trace-ranks all -o "$results/$which.sim" > "$results/$which.sim.log" 2>&1 ||
    fail "$which: simulate ($results/$which.sim.log)"
  run_measured "$results/$which.yaml" "$results/$which.run" --profile || fail "$which: run --profile ($results/$which.run.log)"
  "$bin" diff "$results/$which.sim" "$results/$which.run" -o "$results/$which.diff" > "$results/$which.diff.log" 2>&1 ||
    fail "$which: diff ($results/$which.diff.log)"
done

echo "== calibrate on the training plan"
"$bin" schedule "$results/train.yaml" -o "$results/train.schedule.json" > /dev/null
measured=("$results"/train.run/trace*.json)
"$bin" calibrate "${measured[@]}" --schedule "$results/train.schedule.json" -o "$results/profile.yaml" \
  | tee "$results/calibrate.txt" || fail "calibrate"

for which in train heldout; do
  source_plan=$train_plan
  [ "$which" = heldout ] && source_plan=$heldout_plan
  cut_plan "$source_plan" "$results/$which.calibrated.yaml" profile.yaml
  "$bin" simulate "$results/$which.calibrated.yaml" -q --trace-ranks all -o "$results/$which.calsim" \
    > "$results/$which.calsim.log" 2>&1 || fail "$which: calibrated simulate"
  "$bin" diff "$results/$which.calsim" "$results/$which.run" -o "$results/$which.caldiff" \
    > "$results/$which.caldiff.log" 2>&1 || fail "$which: calibrated diff"
done

echo "== profiling overhead (training plan, with and without --profile)"
run_measured "$results/train.yaml" "$results/train.noprofile" || fail "run without --profile"
overhead=$(python3 - "$results/train.run/report.json" "$results/train.noprofile/report.json" <<'PY'
import json, statistics, sys
def step(path):
    r = json.load(open(path))
    return statistics.median(t for rank in r["ranks"] for t in rank["step_times_ns"])
print(f"{step(sys.argv[1]) / step(sys.argv[2]) - 1:.4f}")
PY
)
# report.json "profile": {"source": "cupti", "ranks": [{"source": {"dropped_records": N, ...}}]}
# (cli/run_command.cc WriteCuptiTrace); a fallback to the host timeline has no such ranks.
dropped=$(python3 - "$results/train.run/report.json" <<'PY'
import json, sys
profile = json.load(open(sys.argv[1])).get("profile", {})
if profile.get("source") != "cupti":
    print(f"n/a (profile source {profile.get('source')})")
else:
    print(sum(r["source"]["dropped_records"] for r in profile["ranks"]))
PY
)

echo "== figures"
echo "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
printf 'plan\tbefore: step err\tmedian op err\tafter: step err\tmedian op err\tp90 op err\n' | tee "$results/loop.tsv"
for which in train heldout; do
  read -r b_step b_med _ <<<"$(diff_figures "$results/$which.diff/report.json")"
  read -r a_step a_med a_p90 <<<"$(diff_figures "$results/$which.caldiff/report.json")"
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$which" "$b_step" "$b_med" "$a_step" "$a_med" "$a_p90" | tee -a "$results/loop.tsv"
  python3 -c "import sys; sys.exit(0 if float('$a_step') <= 0.03 else 1)" || fail "$which: step error $a_step > 3% after calibration"
  python3 -c "import sys; sys.exit(0 if float('$a_med') <= 0.05 else 1)" || fail "$which: median op error $a_med > 5% after calibration"
done
echo "profiling overhead: $overhead (target <= 0.02); dropped CUPTI records: $dropped (target 0)"
python3 -c "import sys; sys.exit(0 if float('$overhead') <= 0.02 else 1)" || fail "profiling overhead $overhead > 2%"
[ "$dropped" = "0" ] || fail "dropped CUPTI records: $dropped"
if [ "$failures" -gt 0 ]; then echo "$failures check(s) failed (see $results/failures.txt)"; exit 1; fi
echo "all loop targets met; results in $results"
