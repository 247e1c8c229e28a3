#!/usr/bin/env bash
# Every bundled example says what it shows on its first line ("# Shows ..."), lowers to a valid
# schedule, and declares what its simulation shows in a top-level `expect:` section that the
# plan loader checks (docs/PLAN.md): check_expectation.py holds report.json to it, from both
# sides (a plan expecting an out-of-memory fails when nothing runs out of memory, one expecting
# completion fails on any OOM or hang). `simulate --compare` prints two plans side by side.
set -euo pipefail
bin=$1
cd "$(dirname "$0")/../.."
check=tests/cli/check_expectation.py
trace_ranks=0
if [ -n "${ASAN_OPTIONS:-}" ]; then trace_ranks=none; fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
count=0

# The checker itself must be able to fail: a report of a completed step does not satisfy a
# plan that expects an out-of-memory, nor a hang, and one without an expectation is refused.
"$bin" simulate -q --trace-ranks none examples/tiny-fsdp2-2gpu.yaml -o "$work/ok" > /dev/null
for outcome in out_of_memory hangs oom_agreed; do
  sed "s/^expect:.*/expect: {outcome: $outcome}/" examples/tiny-fsdp2-2gpu.yaml > "$work/wrong.yaml"
  if python3 "$check" "$work/wrong.yaml" "$work/ok/report.json" > "$work/why.txt"; then
    echo "check_expectation.py accepts a completed step for outcome $outcome"; status=1
  fi
done
grep -v '^expect:' examples/tiny-fsdp2-2gpu.yaml > "$work/none.yaml"
set +e
python3 "$check" "$work/none.yaml" "$work/ok/report.json" > /dev/null
[ $? -eq 2 ] || { echo "check_expectation.py accepts a plan without expect:"; status=1; }
set -e

while IFS= read -r plan; do
  count=$((count + 1))
  if ! head -1 "$plan" | grep -q '^# Shows '; then
    echo "$plan: the first line must be a '# Shows ...' comment saying what the example shows"
    status=1
  fi
  if ! grep -q '^expect:' "$plan"; then
    echo "$plan: needs a top-level expect: {outcome: ...} section (docs/PLAN.md)"
    status=1
    continue
  fi
  if ! "$bin" schedule "$plan" -o "$work/schedule.json" > "$work/out.txt" 2>&1; then
    echo "$plan: does not lower:"
    cat "$work/out.txt"
    status=1
    continue
  fi
  rm -rf "$work/sim"
  # One traced rank: the verdict reads report.json, which covers every rank (the trace writer
  # has its own golden tests; eight traced ranks of the largest examples cost minutes under
  # the sanitizers, where no rank is traced: writing the trace of every example is most of
  # this test's time there, and the release run covers it).
  if ! "$bin" simulate -q --trace-ranks "$trace_ranks" "$plan" -o "$work/sim" > "$work/sim.txt" 2>&1; then
    echo "$plan: does not simulate:"; cat "$work/sim.txt"; status=1; continue
  fi
  if ! python3 "$check" "$plan" "$work/sim/report.json" > "$work/why.txt"; then
    echo "$plan: $(cat "$work/why.txt")"; status=1
  fi
  # An example that states its predicted step ("predicted step 1945.0 ms") must still predict it
  # (to the tenth of a ms it is written with), so the figures in the comments cannot go stale.
  stated=$(head -1 "$plan" | grep -o 'predicted step [0-9.]* ms' | head -1 | grep -o '[0-9.]*' || true)
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
[ $status -eq 0 ] && echo "$count examples lower and simulate to their declared outcome; compare works"
exit $status
