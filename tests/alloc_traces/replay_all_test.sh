#!/usr/bin/env bash
# Replays every bundled allocation trace through `shardscope alloc-replay` (text and --json):
# each must exit 0, and the designed traces must still show what they were designed for
# (retry.json retries without an OOM, oom.json ends in an OOM, expandable segments reserve
# less than the default policy on the fragmentation sequence).
# Usage: replay_all_test.sh path/to/shardscope   (run from the repository root)
set -uo pipefail
bin=$1
dir=tests/alloc_traces
failures=0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

stat_of() {  # stat_of FILE KEY -> the integer value of "KEY" in a --json output
  grep -o "\"$2\": [0-9]*" "$1" | head -1 | sed 's/.*: //'
}

shopt -s nullglob
traces=("$dir"/*.json)
if [ ${#traces[@]} -eq 0 ]; then
  echo "FAIL: no traces under $dir"
  exit 1
fi
for trace in "${traces[@]}"; do
  name=$(basename "$trace" .json)
  if ! "$bin" alloc-replay "$trace" > "$work/$name.txt" 2>&1; then
    echo "FAIL $name: alloc-replay exited $?: $(cat "$work/$name.txt")"
    failures=$((failures + 1))
    continue
  fi
  if ! "$bin" alloc-replay "$trace" --json > "$work/$name.json" 2> "$work/$name.err"; then
    echo "FAIL $name: alloc-replay --json failed: $(cat "$work/$name.err")"
    failures=$((failures + 1))
    continue
  fi
  echo "ok   $name: reserved peak $(stat_of "$work/$name.json" reserved_bytes.all.peak)," \
       "retries $(stat_of "$work/$name.json" num_alloc_retries), ooms $(stat_of "$work/$name.json" num_ooms)"
done

expect() {  # expect DESCRIPTION CONDITION
  if eval "$2"; then echo "ok   $1"; else echo "FAIL $1"; failures=$((failures + 1)); fi
}
if [ -f "$work/retry.json" ]; then
  expect "retry.json retries" '[ "$(stat_of "$work/retry.json" num_alloc_retries)" -ge 1 ]'
  expect "retry.json has no OOM" '[ "$(stat_of "$work/retry.json" num_ooms)" -eq 0 ]'
fi
if [ -f "$work/oom.json" ]; then
  expect "oom.json ends in an OOM" '[ "$(stat_of "$work/oom.json" num_ooms)" -ge 1 ]'
fi
if [ -f "$work/fragmentation.json" ] && [ -f "$work/fragmentation_expandable.json" ]; then
  expect "expandable segments reserve less on the fragmentation sequence" \
    '[ "$(stat_of "$work/fragmentation_expandable.json" reserved_bytes.all.peak)" -lt "$(stat_of "$work/fragmentation.json" reserved_bytes.all.peak)" ]'
fi

# Bad traces: exit 2 and a message naming the file, the op and the key.
printf '{"version": 1, "device_memory_bytes": 1024, "streams": 1, "ops": [{"op": "free", "id": 3}]}' > "$work/unknown_id.json"
printf '{"version": 1, "device_memory_bytes": 1024, "streams": 1, "ops": [{"op": "alloc", "id": 0, "bytes": -1, "stream": 0}]}' > "$work/negative.json"
printf '{"version": 1,\n "ops": [' > "$work/truncated.json"
for case in "unknown_id:ops\[0\]: key 'id': unknown id 3" "negative:ops\[0\]: key 'bytes'" "truncated:truncated.json:2:"; do
  name=${case%%:*} regex=${case#*:}
  out=$("$bin" alloc-replay "$work/$name.json" 2>&1)
  code=$?
  if [ "$code" -ne 2 ] || ! grep -Eq "$regex" <<<"$out" || ! grep -q "$name.json" <<<"$out"; then
    echo "FAIL bad trace $name: exit $code, output: $out"
    failures=$((failures + 1))
  else
    echo "ok   bad trace $name"
  fi
done

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)"
  exit 1
fi
