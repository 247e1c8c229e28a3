#!/usr/bin/env bash
# Validates the CUDA backend of `shardscope run` on this machine's GPU(s) (docs/VALIDATION.md,
# "Runtime (CUDA backend)"): builds shardscope with -DSHARDSCOPE_CUDA=ON, runs the gpu-labelled
# tests (a 1-rank tiny FSDP2 run, the GEMM proxy against the best cuBLASLt algorithm for
# 8192^3 bf16, a CUDA-graph replay), then every bundled example cut to 2 layers on 1 GPU under
# `run --backend cuda --cuda-graph`, and prints the figures: per example the predicted and
# measured step, eager vs graph replay, peak reserved predicted vs run and cudaMemGetInfo's
# free bytes after setup. The peak comparison is a plumbing check (the run and the simulator
# share one allocator object, so it shows the calls are the schedule's, not that the model is
# right): it must hold when the run's capacity is the simulator's, and is reported otherwise.
#
# Needs: an NVIDIA GPU and driver, the CUDA toolkit with cuBLASLt and NCCL (/usr/local/cuda),
# cmake, ninja, g++ >= 12, Open MPI (mpirun), python3. Results go to $OUT if set (else
# build-validate-runtime/results). Exits non-zero on any failed check.
# Usage: scripts/gpu/validate_runtime.sh [EXAMPLE.yaml ...]   (default: examples/**/*.yaml)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=build-validate-runtime
results=${OUT:-$build/results}
mkdir -p "$results"
failures=0
fail() { echo "FAIL: $*" | tee -a "$results/failures.txt"; failures=$((failures + 1)); }

{ nvidia-smi || true; /usr/local/cuda/bin/nvcc --version || true; } > "$results/environment.txt" 2>&1

echo "== build (Release, CUDA ON)"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSHARDSCOPE_CUDA=ON -DSHARDSCOPE_BENCH=OFF \
  > "$results/cmake.log"
ninja -C "$build" ${JOBS:+-j"$JOBS"} shardscope shardscope_runtime_tests shardscope_runtime_gpu_tests \
  > "$results/build.log"
bin=$(realpath "$build/bin/shardscope")

echo "== unit tests (CPU side) and gpu-labelled tests"
"$build/bin/shardscope_runtime_tests" > "$results/unit_tests.log" 2>&1 || fail "runtime unit tests (unit_tests.log)"
# The GPU test binary prints its figures (GEMM TFLOP/s, summaries); ctest records pass/skip.
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  "$build/bin/shardscope_runtime_gpu_tests" > "$results/gpu_tests.log" 2>&1 || fail "gpu tests (gpu_tests.log)"
if grep -q "SKIPPED" "$results/gpu_tests.log"; then fail "gpu tests skipped: $(grep -m1 'no CUDA device' "$results/gpu_tests.log")"; fi
grep -E "^GEMM 8192" "$results/gpu_tests.log" | tee "$results/gemm.txt" || true

echo "== bundled examples cut to 2 layers on 1 GPU"
if [ $# -gt 0 ]; then examples=("$@"); else mapfile -t examples < <(find examples -name '*.yaml' | sort); fi
cuts=$results/cuts
mkdir -p "$cuts"
table=$results/examples.tsv
printf 'example\tstatus\tpredicted_step_ms\teager_step_ms\tgraph_step_ms\teager_over_graph\tpeak_reserved_sim\tpeak_reserved_run\tmeminfo_free_after_setup\n' > "$table"
for example in "${examples[@]}"; do
  name=$(echo "${example#examples/}" | tr '/' '_' | sed 's/\.yaml$//')
  cut=$cuts/$name.yaml
  # The plan override: model.layers 2 and the cluster one node of one GPU. A preset name
  # becomes {preset: NAME, <override>} (docs/PLAN.md: a mapping with a preset and overrides).
  if ! python3 - "$example" "$cut" <<'PY' 2> "$cuts/$name.cut.log"; then
import sys, yaml
plan = yaml.safe_load(open(sys.argv[1]))
for key, override in (("model", {"layers": 2}), ("cluster", {"nodes": 1, "gpus_per_node": 1})):
    value = plan.get(key)
    value = {"preset": value} if isinstance(value, str) else dict(value or {})
    value.update(override)
    plan[key] = value
yaml.safe_dump(plan, open(sys.argv[2], "w"), sort_keys=False)
PY
    printf '%s\tnot cut: %s\n' "$name" "$(tail -1 "$cuts/$name.cut.log")" >> "$table"
    continue
  fi
  if ! "$bin" simulate "$cut" -o "$cuts/$name.sim" -q --trace-ranks none > "$cuts/$name.sim.log" 2>&1; then
    # Plans that need more than one rank (rank variants, HSDP replicas, ...) do not cut to 1 GPU.
    printf '%s\tnot cut to 1 GPU: %s\n' "$name" "$(tail -1 "$cuts/$name.sim.log" | tr '\t' ' ')" >> "$table"
    continue
  fi
  if ! timeout 600 "$bin" run "$cut" --backend cuda --cuda-graph -o "$cuts/$name.run" -q --warmup 1 --steps 3 \
       --timeout 120 > "$cuts/$name.run.log" 2>&1; then
    fail "$name: run --backend cuda failed ($cuts/$name.run.log)"
    printf '%s\trun failed\n' "$name" >> "$table"
    continue
  fi
  python3 - "$name" "$cuts/$name.sim/report.json" "$cuts/$name.run/report.json" >> "$table" <<'PY' || fail "$name: peak reserved differs"
import json, statistics, sys
name, sim, run = sys.argv[1], json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))
r = run["ranks"][0]
eager = statistics.median(r["step_times_ns"]) / 1e6
graph = statistics.median(r.get("graph_step_times_ns") or [0]) / 1e6
# Plumbing: equal peaks unless the device had less free than the simulator's capacity.
same_capacity = r["capacity_bytes"] == r["capacity_planned_bytes"]
ok = r["peak_reserved_bytes"] == sim["memory"]["peak_reserved_bytes"] or not same_capacity
status = "ok" if ok and same_capacity else ("capacity lowered" if ok else "PEAK DIFFERS (plumbing)")
print(f'{name}\t{status}\t{sim["step_time_ns"] / 1e6:.3f}\t{eager:.3f}\t{graph:.3f}\t'
      f'{eager / graph if graph else 0:.3f}\t{sim["memory"]["peak_reserved_bytes"]}\t{r["peak_reserved_bytes"]}\t'
      f'{r["mem_get_info_after_setup"]["free_bytes"]}')
sys.exit(0 if ok else 1)
PY
done

echo "== figures (docs/VALIDATION.md, Runtime (CUDA backend))"
echo "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
cat "$results/gemm.txt" 2>/dev/null || true
column -t -s $'\t' "$table" || cat "$table"
if [ "$failures" -gt 0 ]; then echo "$failures check(s) failed (see $results/failures.txt)"; exit 1; fi
echo "all runtime checks passed; results in $results"
