#!/usr/bin/env bash
# Regenerates the golden outputs from the current build; review `git diff tests/golden` after.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build/bin/shardscope}
out=tests/golden/tiny-fsdp2-2gpu
mkdir -p "$out"
"$bin" simulate examples/tiny-fsdp2-2gpu.yaml -o "$out" -q > /dev/null
# The golden set is the files golden_test.sh compares; simulate's other outputs (the memory
# snapshots as pickles for memory_viz) are not part of it.
rm -f "$out"/memory_snapshot_rank*.pickle
"$bin" schedule examples/tiny-fsdp2-2gpu.yaml -o "$out/schedule.json" > /dev/null
echo "regenerated $out"
