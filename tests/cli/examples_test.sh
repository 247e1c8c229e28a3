#!/usr/bin/env bash
# Every bundled example says what it shows on its first line and lowers to a valid schedule;
# `simulate --compare` prints two plans side by side.
set -euo pipefail
bin=$1
cd "$(dirname "$0")/../.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
count=0
while IFS= read -r plan; do
  count=$((count + 1))
  if ! head -1 "$plan" | grep -q '^# Shows '; then
    echo "$plan: the first line must be a '# Shows ...' comment saying what the example shows"
    status=1
  fi
  if ! "$bin" schedule "$plan" -o "$work/schedule.json" > "$work/out.txt" 2>&1; then
    echo "$plan: does not lower:"
    cat "$work/out.txt"
    status=1
  fi
done < <(find examples -name '*.yaml' | sort)
# No false positive: every example simulates to the end, except those that say on their
# first line that they hang (the report must name a collective mismatch), that the ranks
# agree on an OOM (oom.policy catch_and_sync: no hang, an "oom_agreed" section), or that they
# run out of memory (their report must blame only out-of-memory ranks).
while IFS= read -r plan; do
  rm -rf "$work/sim"
  # One traced rank: the verdicts below read report.json, which covers every rank (the trace
  # writer has its own golden tests; eight traced ranks of the largest examples cost minutes
  # under the sanitizers).
  if ! "$bin" simulate -q --trace-ranks 0 "$plan" -o "$work/sim" > "$work/sim.txt" 2>&1; then
    echo "$plan: does not simulate:"; cat "$work/sim.txt"; status=1; continue
  fi
  first=$(head -1 "$plan")
  if grep -q 'so the step hangs' <<< "$first"; then
    if ! grep -q '"hang": true' "$work/sim/report.json" || ! grep -q '"kind": "mismatch"' "$work/sim/report.json"; then
      echo "$plan: expected a hang with a collective mismatch:"; cat "$work/sim.txt"; status=1
    fi
  elif grep -q 'agree on the OOM flag' <<< "$first"; then
    if ! grep -q '"hang": false' "$work/sim/report.json" || ! grep -q '"oom_agreed"' "$work/sim/report.json"; then
      echo "$plan: expected the ranks to agree on the OOM without a hang:"; cat "$work/sim.txt"; status=1
    fi
  elif grep -q 'out of memory' <<< "$first" && ! grep -q 'no rank runs out of memory' <<< "$first"; then
    if grep -q '"kind": "\(cycle\|mismatch\|never_issued\|other\)"' "$work/sim/report.json"; then
      echo "$plan: expected only out-of-memory causes:"; cat "$work/sim.txt"; status=1
    fi
  elif ! grep -q '"completed": true' "$work/sim/report.json"; then
    echo "$plan: reports a hang:"; cat "$work/sim.txt"; status=1
  fi
  # An example that states its predicted step ("predicted step 1945.0 ms") must still predict it
  # (to the tenth of a ms it is written with), so the figures in the comments cannot go stale.
  stated=$(grep -o 'predicted step [0-9.]* ms' <<< "$first" | head -1 | grep -o '[0-9.]*' || true)
  if [ -n "$stated" ]; then
    step_ns=$(grep -o '"step_time_ns": [0-9]*' "$work/sim/report.json" | grep -o '[0-9]*$')
    predicted=$(awk -v ns="$step_ns" 'BEGIN { printf "%.1f", ns / 1e6 }')
    if [ "$predicted" != "$stated" ]; then
      echo "$plan: its first line states a predicted step of $stated ms, the simulation gives $predicted ms"; status=1
    fi
  fi
done < <(find examples -name '*.yaml' | sort)
"$bin" simulate -q --compare examples/tiny-fsdp2-2gpu.yaml examples/small-fsdp2-8gpu.yaml > "$work/compare.txt"
for row in "step time (ms)" "peak reserved" "B / A" "A: examples/tiny-fsdp2-2gpu.yaml"; do
  grep -qF "$row" "$work/compare.txt" || { echo "compare output lacks '$row'"; cat "$work/compare.txt"; status=1; }
done
[ $status -eq 0 ] && echo "$count examples lower and simulate without a false hang; compare works"
exit $status
