#!/usr/bin/env bash
# Checks shardscope's caching-allocator model against PyTorch's allocator on this machine's
# GPU (docs/VALIDATION.md): builds shardscope, predicts every bundled allocation trace with
# `shardscope alloc-replay --json`, replays the same traces through PyTorch with
# scripts/gpu/replay_alloc_trace.py --compare, and exits non-zero on any mismatch of peak
# reserved bytes or num_alloc_retries. Needs cmake, ninja, a C++20 compiler, python3 and
# PyTorch with CUDA. Results go to $OUT if set (else build-validate/results).
# Usage: scripts/gpu/validate_allocator.sh [TRACE.json ...]   (default: tests/alloc_traces/*.json)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=build-validate
results=${OUT:-$build/results}
mkdir -p "$results"

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSHARDSCOPE_CUDA=OFF -DSHARDSCOPE_BENCH=OFF \
  -DSHARDSCOPE_TESTS=OFF > "$results/cmake.log"
ninja -C "$build" ${JOBS:+-j"$JOBS"} shardscope > "$results/build.log"  # JOBS: parallel jobs (default: ninja's)
bin=$build/bin/shardscope

if [ $# -gt 0 ]; then traces=("$@"); else traces=(tests/alloc_traces/*.json); fi
compare=()
for trace in "${traces[@]}"; do
  name=$(basename "$trace" .json)
  "$bin" alloc-replay "$trace" --json > "$results/$name.predicted.json"
  compare+=(--compare "$results/$name.predicted.json")
done

python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))' \
  | tee "$results/environment.txt"
nvidia-smi >> "$results/environment.txt" 2>&1 || true
set +e
python3 scripts/gpu/replay_alloc_trace.py "${traces[@]}" "${compare[@]}" --out "$results" --snapshot \
  | tee "$results/comparison.txt"
status=${PIPESTATUS[0]}
echo "results in $results (exit $status)"
exit "$status"
