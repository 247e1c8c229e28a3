#!/usr/bin/env bash
# `shardscope diff`: the tiny FSDP2 plan simulated twice (as planned, and with rank 1 a 1.5x
# straggler standing in for a measurement) matches op for op, finds the slower rank's ops,
# and writes the merged trace and both reports; a trace against itself differs nowhere; bad
# input exits 2 naming the file.
set -uo pipefail
bin=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL $1"; failures=$((failures + 1)); }

"$bin" simulate examples/tiny-fsdp2-2gpu.yaml -q -o "$work/predicted" >/dev/null 2>&1 || fail "simulate predicted"
"$bin" simulate examples/tiny-fsdp2-2gpu.yaml -q -o "$work/measured" --straggler 1:1.5 >/dev/null 2>&1 ||
  fail "simulate measured"

out=$("$bin" diff "$work/predicted" "$work/measured" -o "$work/diff" --top 5 2>&1)
code=$?
[ "$code" -eq 0 ] || fail "diff: exit $code: $out"
grep -Eq "^step: predicted [0-9.]+ ms, measured [0-9.]+ ms, difference \+[0-9.]+ ms" <<<"$out" || fail "diff: no step line: $out"
grep -Eq "^matched [0-9]+ ops \([0-9]+ by op id, 0 anchors, 0 by name\); unmatched 0 predicted, 0 measured$" <<<"$out" ||
  fail "diff: not everything matched by op id: $out"
for f in trace.json report.md report.json; do [ -s "$work/diff/$f" ] || fail "diff: no $f"; done
ls "$work/diff" | grep -q tmp && fail "diff: a temporary file was left"
grep -q '"name":"rank 0 predicted"' "$work/diff/trace.json" || fail "trace: no 'rank 0 predicted' process"
grep -q '"name":"rank 1 measured"' "$work/diff/trace.json" || fail "trace: no 'rank 1 measured' process"
grep -q '"cat":"diff","name":"match"' "$work/diff/trace.json" || fail "trace: no match flows"
grep -q '"ph":"i","cat":"diff"\|"cat":"diff".*"ph":"i"\|"name":"diff #1' "$work/diff/trace.json" || fail "trace: no top-N instants"
grep -q '"schema": "shardscope.diff/3"' "$work/diff/report.json" || fail "report.json: no schema"
# report.json lists --top critical-path steps by default, all of them with --full.
/usr/bin/python3 - "$work/diff/report.json" 5 top_n <<'PY' || fail "report.json: default critical-path listing"
import json, sys
side = json.load(open(sys.argv[1]))["measured"]["critical_path"]
assert side["steps_listed"] == sys.argv[3], side["steps_listed"]
assert len(side["steps"]) == min(int(sys.argv[2]), side["step_count"]), (len(side["steps"]), side["step_count"])
assert [s["index"] for s in side["steps"]] == sorted(s["index"] for s in side["steps"])
PY
"$bin" diff "$work/predicted" "$work/measured" -o "$work/full" --top 5 --full >/dev/null 2>&1 || fail "diff --full"
/usr/bin/python3 - "$work/full/report.json" <<'PY' || fail "report.json --full: not every step"
import json, sys
side = json.load(open(sys.argv[1]))["measured"]["critical_path"]
assert side["steps_listed"] == "all" and len(side["steps"]) == side["step_count"] > 5
assert [s["index"] for s in side["steps"]] == list(range(side["step_count"]))
PY
grep -q "^## Error by class" "$work/diff/report.md" || fail "report.md: no class table"
# The straggler's ops are the ones that differ: every top-N row is on rank 1.
rows=$(sed -n '/^## Top/,/^## Critical/p' "$work/diff/report.md" | grep -E '^\| [0-9]+ \|')
[ -n "$rows" ] || fail "report.md: no top-N rows"
grep -v '| rank 1 ' <<<"$rows" && fail "report.md: a top-N op not on the straggler rank"
# The merged trace reads back.
"$bin" diff "$work/diff/trace.json" "$work/diff/trace.json" -o "$work/again" >/dev/null 2>&1 || fail "the merged trace does not read back"

# A trace against itself: no difference, the same bytes twice (deterministic).
out=$("$bin" diff "$work/predicted/trace.json" "$work/predicted" -o "$work/self" --rank 1 2>&1)
grep -q "difference +0.000 ms (+0.0%)" <<<"$out" || fail "self diff: $out"
grep -q "No op differs." "$work/self/report.md" || fail "self diff: report lists ops"
"$bin" diff "$work/predicted/trace.json" "$work/predicted" -o "$work/self2" --rank 1 >/dev/null 2>&1
cmp -s "$work/self/report.json" "$work/self2/report.json" || fail "self diff: report.json differs between runs"
cmp -s "$work/self/trace.json" "$work/self2/trace.json" || fail "self diff: trace.json differs between runs"

# Bad input: exit 2 and the file's name.
err=$("$bin" diff "$work/nope.json" "$work/predicted" -o "$work/bad" 2>&1)
code=$?
[ "$code" -eq 2 ] || fail "missing file: exit $code, expected 2"
grep -q "nope.json" <<<"$err" || fail "missing file: message does not name it: $err"
echo '{"traceEvents": [' >"$work/broken.json"
err=$("$bin" diff "$work/predicted" "$work/broken.json" -o "$work/bad" 2>&1)
code=$?
[ "$code" -eq 2 ] || fail "broken trace: exit $code, expected 2"
grep -q "broken.json" <<<"$err" || fail "broken trace: message does not name it: $err"
[ -e "$work/bad" ] && fail "bad input: an output directory was written"

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "diff CLI tests passed"
