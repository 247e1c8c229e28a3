#!/usr/bin/env bash
# Regenerates the bundled allocation traces (tests/alloc_traces/*.json, docs/ALLOC_TRACE.md)
# from the current build and the hand-designed generator; review `git diff tests/alloc_traces`
# after. Usage: scripts/regen-alloc-traces.sh [path/to/shardscope]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build/bin/shardscope}
out=tests/alloc_traces
# One FSDP2 training step of rank 0 (16 GiB device: fits every data-center GPU, no OOM).
"$bin" alloc-trace examples/tiny-fsdp2-2gpu.yaml --rank 0 --device-memory-gb 16 -o "$out/fsdp2_tiny_step.json"
"$bin" alloc-trace examples/small-fsdp2-8gpu.yaml --rank 0 --device-memory-gb 16 -o "$out/fsdp2_small_step.json"
# fragmentation.json, fragmentation_expandable.json, retry.json, oom.json.
/usr/bin/python3 "$out/make_traces.py" "$out"
for trace in "$out"/*.json; do "$bin" alloc-replay "$trace" > /dev/null; done
echo "regenerated $out"
