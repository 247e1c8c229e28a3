#!/usr/bin/env bash
# Golden test: the CLI's outputs for examples/tiny-fsdp2-2gpu.yaml must equal the reviewed
# files in tests/golden/tiny-fsdp2-2gpu/ byte for byte. Regenerate (then review the diff):
#   scripts/regen-golden.sh
set -euo pipefail
bin=$1
golden=tests/golden/tiny-fsdp2-2gpu
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$bin" simulate examples/tiny-fsdp2-2gpu.yaml -o "$out" -q > "$out/summary.txt"
"$bin" schedule examples/tiny-fsdp2-2gpu.yaml -o "$out/schedule.json" > /dev/null
status=0
for f in trace.json report.json schedule.json memory_snapshot_rank0.json memory_snapshot_rank1.json; do
  if ! cmp -s "$golden/$f" "$out/$f"; then
    echo "golden mismatch: $f (regenerate with scripts/regen-golden.sh and review the diff)"
    diff <(head -c 200000 "$golden/$f") <(head -c 200000 "$out/$f") | head -20 || true
    status=1
  fi
done
# The same schedule, read back from JSON, simulates to the same report.
"$bin" simulate "$out/schedule.json" -o "$out/from-json" -q > /dev/null
if ! diff <(grep -v '"source"' "$out/report.json") <(grep -v '"source"' "$out/from-json/report.json") > /dev/null; then
  echo "simulating the schedule JSON gives a different report than simulating the plan"
  status=1
fi
[ $status -eq 0 ] && echo "golden outputs match"
exit $status
