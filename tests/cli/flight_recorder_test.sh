#!/usr/bin/env bash
# `shardscope flight-recorder DIR`: on real PyTorch dumps (the NVIDIA 16-rank fixture, whose
# source asserts the figures checked here) and on the dumps `simulate` writes, which must give
# the verdict simulate itself printed; exit codes 1 (hang), 0 (none), 2 (bad input).
#
# Usage: flight_recorder_test.sh path/to/shardscope   (from the repository root)
set -euo pipefail

shardscope=$(realpath "$1")
python=/usr/bin/python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# ---- (a) the real dumps: missing ranks {12} in process group 74 (EXPERT_MODEL_PARALLEL_GROUP),
# nccl:all_to_all of 4027x5120 BFloat16 (NVIDIA/nvidia-resiliency-ext test_fr.py); exit 1.
real=tests/fixtures/real/flight-recorder/moe-16-ranks-gpu-error
set +e
"$shardscope" flight-recorder "$real" --json > "$work/real.json" 2> "$work/real.err"
rc=$?
"$shardscope" flight-recorder "$real" > "$work/real.txt" 2>&1
rc_text=$?
set -e
[ "$rc" -eq 1 ] || fail "(a) --json: expected exit 1 (hang), got $rc: $(cat "$work/real.err")"
[ "$rc_text" -eq 1 ] || fail "(a) text: expected exit 1 (hang), got $rc_text"
"$python" - "$work/real.json" <<'PY' || fail "(a) JSON verdict"
import json, sys
report = json.load(open(sys.argv[1]))
hang = report["hangs"][0]
expected = {"process_group": "74", "process_group_desc": "EXPERT_MODEL_PARALLEL_GROUP",
            "collective": "nccl:all_to_all", "sizes": [[4027, 5120]], "dtype": "BFloat16",
            "missing_ranks": [12], "mismatch": None}
bad = {k: (hang[k], v) for k, v in expected.items() if hang[k] != v}
if report["dumps"] != 16: bad["dumps"] = report["dumps"]
if bad:
    print("  (a)", bad); sys.exit(1)
PY
grep -q "^HANG 1: ranks 13-15 wait in nccl:all_to_all #20537 on process group 74 (EXPERT_MODEL_PARALLEL_GROUP), 4027x5120 BFloat16, for rank 12" "$work/real.txt" \
  || { fail "(a) text: first line"; cat "$work/real.txt"; }

# ---- (b) simulate's dumps, same verdict as simulate: rank 3 of the small FSDP2 plan runs out
# of memory (injected, op 10); ranks 0-2,4-7 wait in all_gather #1 on 'dp_shard' for it.
"$shardscope" simulate examples/small-fsdp2-8gpu.yaml --inject-oom 3:10 -o "$work/sim" -q --trace-ranks none > /dev/null
set +e
"$shardscope" flight-recorder "$work/sim" --json > "$work/sim.json" 2> "$work/sim.err"
rc=$?
set -e
[ "$rc" -eq 1 ] || fail "(b) expected exit 1 on simulate's dumps, got $rc: $(cat "$work/sim.err")"
"$python" - "$work/sim/report.json" "$work/sim.json" <<'PY' || fail "(b) simulate's verdict"
import json, re, sys
sim = json.load(open(sys.argv[1]))["hang_report"]
fr = json.load(open(sys.argv[2]))
explanation = sim["explanation"][0]
# "...; ranks 0-2,4-7 wait in all_gather #1 on 'dp_shard' for rank 3"
m = re.search(r"ranks? ([\d,-]+) waits? in (\w+) #(\d+) on '([^']+)' for rank (\d+)", explanation)
if not m:
    print("  (b) unexpected explanation:", explanation); sys.exit(1)
waiting, collective, seq, group, missing = m.groups()
hang = fr["hangs"][0]
def compress(ranks):
    out, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1: j += 1
        out.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}"); i = j + 1
    return ",".join(out)
got = (compress(hang["waiting_ranks"]), hang["collective"], hang["seq"], hang["process_group_desc"], hang["missing_ranks"])
want = (waiting, "nccl:" + collective, int(seq), group, [int(missing)])
if got != want or len(fr["hangs"]) != 1:
    print("  (b) flight-recorder", got, "simulate", want, "hangs", len(fr["hangs"])); sys.exit(1)
PY

# ---- (c) a divergence: simulate predicts a size mismatch; the dumps (2000 entries, PyTorch's
# recommended buffer) give the same collective, sequence number and kind.
"$shardscope" simulate examples/divergence/ddp-bucket-layout.yaml -o "$work/div" -q --trace-ranks none > /dev/null
set +e
"$shardscope" flight-recorder "$work/div" --json > "$work/div.json" 2> /dev/null
rc=$?
set -e
[ "$rc" -eq 1 ] || fail "(c) expected exit 1, got $rc"
"$python" - "$work/div/report.json" "$work/div.json" <<'PY' || fail "(c) divergence verdict"
import json, re, sys
sim = json.load(open(sys.argv[1]))["hang_report"]
hang = json.load(open(sys.argv[2]))["hangs"][0]
m = re.search(r"#(\d+) on '([^']+)'.*\((SIZE_OR_SYNTAX_MISMATCH|COLLECTIVE_TYPE_MISMATCH)\)", sim["explanation"][0])
if not m or hang["mismatch"] is None or hang["mismatch"]["kind"] != m.group(3) \
   or hang["process_group_desc"] != m.group(2) or hang["seq"] != int(m.group(1)):
    print("  (c)", sim["explanation"][0], hang["mismatch"], hang["seq"]); sys.exit(1)
PY

# ---- (d) no hang: every rank at the same collective, nothing missing -> exit 0.
mkdir -p "$work/ok"
for r in 0 1; do
  cat > "$work/ok/nccl_trace_rank_$r.json" <<JSON
{"version": "2.9", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
 "entries": [{"record_id": 0, "pg_id": 0, "process_group": ["0", "default_pg"], "collective_seq_id": 1,
   "p2p_seq_id": 0, "op_id": 1, "profiling_name": "nccl:all_reduce", "time_created_ns": 1,
   "input_sizes": [[4]], "input_dtypes": ["Float"], "output_sizes": [[4]], "output_dtypes": ["Float"],
   "state": "completed", "retired": true, "is_p2p": false}]}
JSON
done
"$shardscope" flight-recorder "$work/ok" > "$work/ok.out" 2>&1 || fail "(d) expected exit 0: $(cat "$work/ok.out")"
grep -q "no hang found" "$work/ok.out" || fail "(d) no 'no hang found' line"

# ---- (e) bad input: exit 2 with the file and what is wrong.
mkdir -p "$work/bad"
printf 'not a dump' > "$work/bad/nccl_trace_rank_0"
set +e
"$shardscope" flight-recorder "$work/bad" > /dev/null 2> "$work/bad.err"; rc=$?
"$shardscope" flight-recorder "$work/nonexistent" > /dev/null 2> "$work/none.err"; rc_none=$?
set -e
[ "$rc" -eq 2 ] || fail "(e) expected exit 2 on a file that is not a dump, got $rc"
grep -q "nccl_trace_rank_0: neither a pickle" "$work/bad.err" || fail "(e) message: $(cat "$work/bad.err")"
[ "$rc_none" -eq 2 ] || fail "(e) expected exit 2 on a missing folder, got $rc_none"

if [ "$failures" -gt 0 ]; then echo "$failures failure(s)"; exit 1; fi
echo "flight-recorder: all checks passed"
