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
"$bin" simulate -q --compare examples/tiny-fsdp2-2gpu.yaml examples/small-fsdp2-8gpu.yaml > "$work/compare.txt"
for row in "step time (ms)" "peak reserved" "B / A" "A: examples/tiny-fsdp2-2gpu.yaml"; do
  grep -qF "$row" "$work/compare.txt" || { echo "compare output lacks '$row'"; cat "$work/compare.txt"; status=1; }
done
[ $status -eq 0 ] && echo "$count examples lower; compare works"
exit $status
