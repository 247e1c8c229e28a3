#!/usr/bin/env bash
# `shardscope alloc-replay --snapshot` on the real transformer snapshot
# (tests/fixtures/real/memory-snapshots/transformer-small-forward, figures from its README):
# verdict exact, exit 0, the counts its source states; a device too small for the recorded
# run makes the model diverge (exit 1, the divergence printed); bad input exits 2 with the
# file named and nothing on stdout.
# Usage: alloc_snapshot_test.sh path/to/shardscope   (run from the repository root)
set -uo pipefail
bin=$1
snapshot=tests/fixtures/real/memory-snapshots/transformer-small-forward/memory_small_forward.pickle
failures=0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
has() {  # has FILE TEXT
  grep -qF -- "$2" "$1" || fail "$1 lacks '$2': $(head -c 2000 "$1")"
}

"$bin" alloc-replay --snapshot "$snapshot" > "$work/text.txt" 2> "$work/text.err"
rc=$?
[ "$rc" -eq 0 ] || fail "text: exit $rc (expected 0): $(cat "$work/text.err")"
has "$work/text.txt" "verdict: exact"
has "$work/text.txt" "8507 actions"

"$bin" alloc-replay --snapshot "$snapshot" --json > "$work/out.json" 2> "$work/json.err"
rc=$?
[ "$rc" -eq 0 ] || fail "--json: exit $rc (expected 0): $(cat "$work/json.err")"
# The source's counts: 3 segment_alloc, 2,998 alloc + 2,753 free_requested + 2,753
# free_completed; no segment is freed, so reserved peaks at the final 1,107,296,256 B.
python3 - "$work/out.json" <<'PY' || fail "--json content"
import json, sys
j = json.load(open(sys.argv[1]))
expected = {"verdict": "exact", "actions": 2998 + 2753 + 2753 + 3,
            "segment_allocs": {"recorded": 3, "model": 3}, "segment_frees": {"recorded": 0, "model": 0},
            "peak_reserved_bytes": {"recorded": 1107296256, "model": 1107296256}, "first_divergence": None}
for key, value in expected.items():
    if j.get(key) != value:
        sys.exit("key %s: expected %r, got %r" % (key, value, j.get(key)))
if list(j)[:6] != ["verdict", "actions", "segment_allocs", "segment_frees", "peak_reserved_bytes", "alloc_retries"]:
    sys.exit("key order: %r" % list(j)[:6])
PY

# 1 GB cannot hold what the recorded run reserved (1.1 GB): the model must run out first.
"$bin" alloc-replay --snapshot "$snapshot" --device-memory-bytes 1000000000 > "$work/small.txt" 2> "$work/small.err"
rc=$?
[ "$rc" -eq 1 ] || fail "small device: exit $rc (expected 1)"
has "$work/small.txt" "verdict: diverges at device_traces[0]["
has "$work/small.err" "diverges"

# Bad input: a JSON file, a truncated pickle, options that do not go together.
printf '{"segments": []}' > "$work/not.pickle"
head -c 1000 "$snapshot" > "$work/cut.pickle"
for input in "$work/not.pickle" "$work/cut.pickle"; do
  "$bin" alloc-replay --snapshot "$input" > "$work/bad.out" 2> "$work/bad.err"
  rc=$?
  [ "$rc" -eq 2 ] || fail "$input: exit $rc (expected 2)"
  [ ! -s "$work/bad.out" ] || fail "$input: wrote to stdout: $(cat "$work/bad.out")"
  has "$work/bad.err" "$input"
done
"$bin" alloc-replay --snapshot "$snapshot" tests/alloc_traces/retry.json > /dev/null 2>&1
rc=$?
[ "$rc" -eq 2 ] || fail "--snapshot with a trace: exit $rc (expected 2)"
"$bin" alloc-replay --device-memory-bytes 5 tests/alloc_traces/retry.json > /dev/null 2>&1
rc=$?
[ "$rc" -eq 2 ] || fail "--device-memory-bytes without --snapshot: exit $rc (expected 2)"
"$bin" alloc-replay > /dev/null 2>&1
rc=$?
[ "$rc" -eq 2 ] || fail "no input: exit $rc (expected 2)"

# Plumbing (the model against itself): a simulated run's memory_snapshot_rank0.pickle holds
# the keys memory_viz reads and replays exactly, since the model wrote it.
if "$bin" simulate examples/tiny-fsdp2-2gpu.yaml -o "$work/sim" -q > /dev/null 2> "$work/sim.err"; then
  python3 - "$work/sim/memory_snapshot_rank0.pickle" <<'PY' || fail "simulated pickle layout"
import pickle, pickletools, sys
raw = open(sys.argv[1], "rb").read()
# The opcodes memory_viz's own unpickler handles (torch/utils/viz/MemoryViz.js, unpickle).
viz = {"PROTO", "APPEND", "APPENDS", "BINGET", "BININT", "BININT1", "BININT2", "EMPTY_DICT", "EMPTY_LIST",
       "FRAME", "LONG1", "LONG_BINGET", "MARK", "MEMOIZE", "SETITEMS", "SHORT_BINUNICODE", "STOP", "TUPLE2",
       "NEWFALSE", "BINPUT", "BINUNICODE", "EMPTY_TUPLE", "NEWTRUE", "NONE", "BINFLOAT", "TUPLE", "TUPLE1",
       "TUPLE3", "LONG_BINPUT", "LIST", "DICT", "SETITEM"}
used = {op.name for op, _, _ in pickletools.genops(raw)}
assert used <= viz, "opcodes memory_viz cannot read: %s" % sorted(used - viz)
d = pickle.loads(raw)
assert set(d) >= {"segments", "device_traces"}, list(d)
assert len(d["device_traces"]) == 1 and d["device_traces"][0], "one device with actions"
for seg in d["segments"]:
    assert seg["device"] == 0 and isinstance(seg["frames"], list)
    for key in ("address", "total_size", "stream", "segment_type", "blocks"):
        assert key in seg, key
    for b in seg["blocks"]:
        assert {"address", "size", "requested_size", "state", "frames"} <= set(b), b
for e in d["device_traces"][0]:
    assert {"action", "size", "stream", "frames"} <= set(e) and ("addr" in e or "device_free" in e), e
PY
  "$bin" alloc-replay --snapshot "$work/sim/memory_snapshot_rank0.pickle" > "$work/sim.txt" 2>&1 \
    || fail "simulated snapshot: $(cat "$work/sim.txt")"
  has "$work/sim.txt" "verdict: exact"
else
  fail "simulate: $(cat "$work/sim.err")"
fi

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "alloc-replay --snapshot: all checks passed"
