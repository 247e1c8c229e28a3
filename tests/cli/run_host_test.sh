#!/usr/bin/env bash
# `shardscope run --backend host` under mpirun: the runtime executes schedules with real MPI
# collectives; a rank that runs out of memory under the raise policy (or ranks that run
# different plans) hangs its peers until the watchdog dumps a Flight Recorder per rank that
# says what the simulator said; the measured timeline holds every op of the schedule where the
# schedule puts it; an uneven all_to_all (MoE routing imbalance) runs.
#
# A plumbing check, named as such: the run's allocator peaks equal the simulator's. Both go
# through the same sim::CachingAllocator with the same calls, so the equality shows the
# runtime makes the schedule's allocator calls in the simulator's order, not that the
# allocator model is right (docs/VALIDATION.md: the real check is the model against PyTorch's
# allocator on recorded traces and snapshots).
#
# Usage: run_host_test.sh path/to/shardscope   (from the repository root)
set -euo pipefail

shardscope=$(realpath "$1")
python=/usr/bin/python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# As root, Open MPI's mpirun refuses to start without these; --oversubscribe lets 4 ranks run
# on a 2-core machine (Open MPI then yields in its busy-polling loops).
mpirun_cmd=(mpirun --allow-run-as-root --oversubscribe)
# Under an ASan build: Open MPI's plugins leave allocations behind and are dlclose'd before
# LeakSanitizer runs, so their leaks show as "<unknown module>" and cannot be suppressed by
# library; leak detection is off for these MPI runs only (later ASAN_OPTIONS entries win).
# ASan's memory errors and UBSan stay on; the runtime's unit tests keep leak detection.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"

# ---- (a) the tiny golden schedule completes on 2 ranks and per-rank step times are measured;
# plumbing: the allocator peaks equal the simulator's (the same allocator object, fed the same
# calls: a wrong call order or a missing call would break it, a wrong allocator model would not).
golden=tests/golden/tiny-fsdp2-2gpu/schedule.json
"$shardscope" simulate "$golden" -o "$work/sim2" -q --trace-ranks none > /dev/null
if timeout 120 "${mpirun_cmd[@]}" -np 2 "$shardscope" run "$golden" -o "$work/run2" -q --warmup 1 --steps 2 \
     --timeout 30 > "$work/run2.out" 2>&1; then
  "$python" - "$work/sim2/report.json" "$work/run2/report.json" "$work/run2/host_timeline.json" <<'EOF' || fail "(a) report"
import json, sys
sim, run, timeline = (json.load(open(p)) for p in sys.argv[1:4])
ok = True
def check(cond, what):
    global ok
    if not cond:
        print("  (a)", what); ok = False
check(run["completed"] is True, "run did not complete")
check(run["world_size"] == 2 and len(run["ranks"]) == 2, "expected 2 ranks")
for key in ("shardscope_version", "source", "strategy", "model", "world_size", "cluster", "completed",
            "step_time_ns", "memory", "hang", "ranks"):
    check(key in run and key in sim, f"top-level key {key} missing")
check(set(run["memory"]) == set(sim["memory"]), f"memory keys differ: {sorted(run['memory'])} vs {sorted(sim['memory'])}")
for r_run, r_sim in zip(run["ranks"], sim["ranks"]):
    times = r_run["step_times_ns"]
    check(len(times) == 2 and all(t > 0 for t in times), f"rank {r_run['rank']}: step times {times}")
    check(r_run["step_time_ns"] in times, f"rank {r_run['rank']}: step_time_ns is not one of its steps")
    # Plumbing: the same allocator over the same calls gives the same peaks, byte for byte.
    for key in ("peak_reserved_bytes", "peak_allocated_bytes", "capacity_bytes", "num_alloc_retries", "num_ooms"):
        check(r_run[key] == r_sim[key], f"rank {r_run['rank']}: plumbing: {key} run {r_run[key]} != simulated {r_sim[key]}")
check(run["memory"]["peak_reserved_bytes"] == sim["memory"]["peak_reserved_bytes"], "plumbing: peak reserved differs")
# The measured host timeline: both ranks, slices that carry the schedule's op ids.
slices = [e for e in timeline["traceEvents"] if e.get("ph") == "X"]
check({e["pid"] for e in slices} == {0, 1}, "timeline: expected slices of ranks 0 and 1")
check(all("op id" in e["args"] for e in slices), "timeline: a slice without an op id")
check(any(e.get("args", {}).get("Collective name") == "all_gather" for e in slices), "timeline: no all_gather slice")
sys.exit(0 if ok else 1)
EOF
else
  fail "(a) mpirun -np 2 run $golden exited non-zero:"; cat "$work/run2.out"
fi

# ---- (b) the acceptance test: 4 ranks, rank 2 runs out of memory (injected) in forward under
# the raise policy. Its peers wait in the next all_gather; the watchdog (5 s) fires, every rank
# dumps its flight recorder, the job aborts non-zero, and the dumps agree with the simulator's
# hang report: the same blocked collective and per-communicator sequence numbers.
sed 's/gpus_per_node: 2/gpus_per_node: 4/' examples/tiny-fsdp2-2gpu.yaml > "$work/tiny4.yaml"
# op 53 of rank 2: allocate act.layers.0.attn.norm.out in forward (after the layers.0 all_gather,
# all_gather #2 on dp_shard, was issued): `shardscope schedule --listing --rank 2` shows it.
"$shardscope" simulate "$work/tiny4.yaml" --inject-oom 2:53 -o "$work/sim4" -q --trace-ranks none > /dev/null
start=$(date +%s)
set +e
timeout 120 "${mpirun_cmd[@]}" -np 4 "$shardscope" run "$work/tiny4.yaml" -o "$work/run4" -q --warmup 0 --steps 1 \
  --timeout 5 --inject-oom 2:53 > "$work/run4.out" 2>&1
rc=$?
set -e
elapsed=$(( $(date +%s) - start ))
if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ]; then
  fail "(b) expected the watchdog to abort the job (non-zero, not the test's timeout), got exit $rc"; cat "$work/run4.out"
fi
grep -q "rank 2: out of memory at op 53 (injected)" "$work/run4.out" || fail "(b) no OOM message for rank 2"
grep -q "watchdog timeout" "$work/run4.out" || fail "(b) no watchdog message"
"$python" - "$work/sim4" "$work/run4/flight_recorder" <<'EOF' || { fail "(b) flight recorder dumps"; cat "$work/run4.out"; }
import json, os, sys
sim_dir, run_dir = sys.argv[1:3]
sim_report = json.load(open(os.path.join(sim_dir, "report.json")))
ok = True
def check(cond, what):
    global ok
    if not cond:
        print("  (b)", what); ok = False
watchdog = sim_report["hang_report"]["watchdog"]
check(sim_report["hang"] is True, "the simulator does not predict a hang")
def pending(entries):
    return [(e["pg_id"], e["collective_seq_id"], e["p2p_seq_id"], e["profiling_name"], e["state"])
            for e in entries if e["state"] != "completed"]
for rank in range(4):
    path = os.path.join(run_dir, f"rank_{rank}.json")
    if not os.path.exists(path):
        check(False, f"rank {rank}: no dump {path}"); continue
    run = json.load(open(path))
    sim = json.load(open(os.path.join(sim_dir, f"flight_recorder_rank{rank}.json")))
    check(run["pg_config"] == sim["pg_config"], f"rank {rank}: pg_config differs")
    check(run["pg_status"] == sim["pg_status"], f"rank {rank}: pg_status {run['pg_status']} != simulated {sim['pg_status']}")
    check(pending(run["entries"]) == pending(sim["entries"]),
          f"rank {rank}: unfinished entries {pending(run['entries'])} != simulated {pending(sim['entries'])}")
    blocked = run["shardscope"]["blocked_collective"]
    if rank == 2:
        check(blocked is None, "rank 2 (out of memory) should not be blocked in a collective")
        check("out of memory at op 53" in run["shardscope"]["host"], f"rank 2 host: {run['shardscope']['host']}")
    else:
        # The collective the simulator's watchdog times out: all_gather #3 on dp_shard, where
        # ranks 0, 1, 3 wait for rank 2.
        check(blocked is not None and blocked["process_group"] == watchdog["communicator"]
              and blocked["collective_seq_id"] == watchdog["collective_seq_id"]
              and blocked["state"] == "started",
              f"rank {rank}: blocked in {blocked}, simulated {watchdog['collective']}")
        check(run["shardscope"]["missing_ranks"] == [2], f"rank {rank}: missing {run['shardscope']['missing_ranks']}")
sys.exit(0 if ok else 1)
EOF
echo "  (b) watchdog test took ${elapsed} s"
# The runtime's dumps through `shardscope flight-recorder` give the simulator's verdict: ranks
# 0, 1, 3 wait in the watchdog's all_gather on dp_shard for rank 2 (exit 1: a hang).
set +e
"$shardscope" flight-recorder "$work/run4" --json > "$work/run4.fr.json" 2> /dev/null
rc=$?
set -e
[ "$rc" -eq 1 ] || fail "(b) flight-recorder on the runtime's dumps: expected exit 1, got $rc"
"$python" - "$work/sim4/report.json" "$work/run4.fr.json" <<'EOF2' || fail "(b) flight-recorder verdict on the runtime's dumps"
import json, sys
watchdog = json.load(open(sys.argv[1]))["hang_report"]["watchdog"]
hang = json.load(open(sys.argv[2]))["hangs"][0]
got = (hang["process_group_desc"], hang["seq"], hang["waiting_ranks"], hang["missing_ranks"])
want = (watchdog["communicator"], watchdog["collective_seq_id"], [0, 1, 3], [2])
if got != want:
    print("  (b) flight-recorder", got, "simulated", want); sys.exit(1)
EOF2

# ---- (c) errors: the world size must match the schedule; --backend cuda of the 2-rank
# schedule from one process cannot run here (no CUDA backend in this build, no CUDA device, or
# fewer than 2 local GPUs: tests/cli/run_cuda_test.sh checks those paths).
set +e
timeout 60 "${mpirun_cmd[@]}" -np 2 "$shardscope" run "$work/tiny4.yaml" -o "$work/bad" -q > "$work/bad.out" 2>&1
rc=$?
set -e
[ "$rc" -eq 2 ] || fail "(c) world size mismatch: expected exit 2, got $rc"
grep -q "schedule has 4 ranks, the job has 2" "$work/bad.out" || fail "(c) no world-size message"
set +e
"$shardscope" run "$golden" -o "$work/cuda" --backend cuda > "$work/cuda.out" 2>&1
rc=$?
set -e
if [ "$rc" -ne 0 ]; then  # 0: a machine with 2 GPUs ran it
  [ "$rc" -eq 2 ] || fail "(c) --backend cuda: expected exit 2, got $rc"
  grep -Eq "no CUDA backend|no CUDA device: |schedule has 2 ranks, the job has 1 process" "$work/cuda.out" ||
    fail "(c) --backend cuda: no message"
  [ ! -e "$work/cuda/report.json" ] || fail "(c) --backend cuda wrote a report"
fi

# ---- (d) --profile on the host backend: the measured timeline is the host timeline, written as
# DIR/trace.json, and `shardscope diff` matches every predicted op of the simulation to it by
# op id (both sides carry the schedule's op ids; docs/DIFF.md "matching").
"$shardscope" simulate "$golden" -o "$work/simtrace" -q > /dev/null
if timeout 120 "${mpirun_cmd[@]}" -np 2 "$shardscope" run "$golden" -o "$work/prof" -q --warmup 1 --steps 2 \
     --timeout 30 --profile > "$work/prof.out" 2>&1; then
  [ -s "$work/prof/trace.json" ] || fail "(d) --profile wrote no trace.json"
  # The measured timeline against the schedule (an input the run did not write): each rank's
  # host thread issued every op of its program once per step, in program order, and each
  # kernel, copy and collective ran once per step on the track of the stream the schedule
  # gives it.
  "$python" - "$golden" "$work/prof/trace.json" <<'EOF_D' || fail "(d) the measured timeline does not follow the schedule"
import json, sys
schedule, trace = (json.load(open(p)) for p in sys.argv[1:3])
programs = {p["name"]: p for p in schedule["programs"]}
slices = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
steps = 3  # --warmup 1 --steps 2
ok = True
for binding in schedule["ranks"]:
    rank, program = binding["rank"], programs[binding["program"]]
    streams = [s["name"] for s in program["streams"]]
    ids = [op["id"] for op in program["ops"]]
    host = sorted((e for e in slices if e["pid"] == rank and e["tid"] == 0), key=lambda e: e["ts"])
    got = [(e["args"]["step"], e["args"]["op id"]) for e in host]
    want = [(step, i) for step in range(steps) for i in ids]
    if got != want:
        print(f"  (d) rank {rank}: host-thread slices are not the program in order ({len(got)} vs {len(want)})"); ok = False
    device_ops = {op["id"]: 1 + streams.index(op["stream"]) for op in program["ops"]
                  if op["op"] in ("kernel", "memcpy", "collective")}
    on_streams = sorted((e["args"]["step"], e["args"]["op id"], e["tid"]) for e in slices
                        if e["pid"] == rank and e["tid"] != 0)
    want_streams = sorted((step, i, tid) for step in range(steps) for i, tid in device_ops.items())
    if on_streams != want_streams:
        print(f"  (d) rank {rank}: stream slices differ from the schedule's streams "
              f"({len(on_streams)} vs {len(want_streams)})"); ok = False
sys.exit(0 if ok else 1)
EOF_D
  if "$shardscope" diff "$work/simtrace" "$work/prof" -o "$work/profdiff" > "$work/profdiff.out" 2>&1; then
    "$python" - "$work/profdiff/report.json" "$work/prof/report.json" "$work/prof/trace.json" <<'EOF2' || fail "(d) diff"
import json, sys
diff, run = (json.load(open(p)) for p in sys.argv[1:3])
m = diff["matching"]
ok = True
if not (m["matched"] > 0 and m["by_op_id"] == m["matched"] and m["unmatched_predicted"] == 0
        and m["by_anchor"] == 0 and m["by_name"] == 0):
    print("  (d) expected every predicted op matched by op id, got", m); ok = False
if run.get("profile", {}).get("source") != "host_timeline":
    print("  (d) report.json profile.source:", run.get("profile")); ok = False
# One step against one step: 1 warm-up + 2 measured steps (0, 1, 2); the median of the
# measured ones is step 1 or 2 (docs/DIFF.md "Steps"), and the default --time-scale 0.001
# gets a warning.
meas = diff["measured"]
if meas.get("selected_step") not in (1, 2):
    print("  (d) expected a measured step after the warm-up, got", meas.get("selected_step")); ok = False
# The cut side holds exactly the trace's slices of that step (their "step" arg).
trace = json.load(open(sys.argv[3]))
in_step = sum(1 for e in trace["traceEvents"]
              if e.get("ph") == "X" and e.get("args", {}).get("step") == meas.get("selected_step"))
if meas["events"] != in_step:
    print("  (d) measured events", meas["events"], "!= slices of the selected step", in_step); ok = False
if not any("--time-scale 0.001" in w for w in meas.get("warnings", [])):
    print("  (d) no time-scale warning:", meas.get("warnings")); ok = False
sys.exit(0 if ok else 1)
EOF2
  else
    fail "(d) shardscope diff exited non-zero: $(tail -3 "$work/profdiff.out")"
  fi
else
  fail "(d) run --profile failed: $(tail -5 "$work/prof.out")"
fi

# ---- (e) a plan-level divergence: rank 1 runs FSDP2 without backward prefetch. The simulator
# predicts a collective type mismatch at dp_shard #5 (sim/plan/src/divergence_test.cc derives it);
# on the host backend the two ranks enter MPI collectives of different kinds at that sequence
# number, no op completes, and the watchdog's dumps name the same collective on each rank.
cp examples/tiny-fsdp2-2gpu.yaml "$work/divergent.yaml"
printf 'divergence:\n  overrides: [{ranks: [1], fsdp2: {backward_prefetch: 0}}]\n' >> "$work/divergent.yaml"
"$shardscope" simulate "$work/divergent.yaml" -o "$work/simdiv" -q --trace-ranks none > /dev/null
set +e
timeout 120 "${mpirun_cmd[@]}" -np 2 "$shardscope" run "$work/divergent.yaml" -o "$work/rundiv" -q --warmup 0 \
  --steps 1 --timeout 3 > "$work/rundiv.out" 2>&1
rc=$?
set -e
if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ]; then
  fail "(e) expected the watchdog to abort the divergent job, got exit $rc"; cat "$work/rundiv.out"
fi
"$python" - "$work/simdiv" "$work/rundiv/flight_recorder" <<'EOF3' || fail "(e) divergence dumps"
import json, os, sys
sim_dir, run_dir = sys.argv[1:3]
cause = json.load(open(os.path.join(sim_dir, "report.json")))["hang_report"]["causes"][0]
ok = True
if (cause["kind"], cause["communicator"], cause["seq"], cause["ranks"]) != ("mismatch", "dp_shard", 5, [0, 1]):
    print("  (e) the simulator's prediction changed:", cause); ok = False
for rank in (0, 1):
    # The simulator's dump: the first unfinished entry is the collective the rank waits in
    # (rank 0: nccl:all_gather, rank 1: nccl:reduce_scatter).
    sim = json.load(open(os.path.join(sim_dir, f"flight_recorder_rank{rank}.json")))
    first = next(e for e in sim["entries"] if e["state"] != "completed")
    want = (cause["communicator"], cause["seq"], first["profiling_name"])
    blocked = json.load(open(os.path.join(run_dir, f"rank_{rank}.json")))["shardscope"]["blocked_collective"] or {}
    got = (blocked.get("process_group"), blocked.get("collective_seq_id"), blocked.get("profiling_name"))
    if got != want or first["collective_seq_id"] != cause["seq"]:
        print(f"  (e) rank {rank}: blocked in {got}, simulated {want}"); ok = False
sys.exit(0 if ok else 1)
EOF3

# ---- (f) an uneven all_to_all: examples/divergence/moe-imbalance.yaml (rank 3's experts get
# 1.6x the tokens: its dispatch and combine carry 1.6x the bytes of its 7 peers'), cut to one
# 8-GPU node and a small model so 8 processes fit this machine; the same divergence and
# expert parallelism. Before, per-peer counts came from each rank's own size and MPI_Alltoall
# failed on the mismatch; now the counts both sides agree on run as MPI_Alltoallv and the job
# completes.
sed -e 's/^model: mixtral-8x7b$/model: {preset: mixtral-8x7b, layers: 2, hidden: 256, ffn: 512, heads: 4, kv_heads: 4, vocab: 1024}/' \
    -e 's/^cluster: {preset: dgx-h100, nodes: 4}$/cluster: {preset: dgx-h100, nodes: 1}/' \
    -e 's/seq_len: 4096/seq_len: 256/' examples/divergence/moe-imbalance.yaml > "$work/moe.yaml"
grep -q "layers: 2" "$work/moe.yaml" && grep -q "nodes: 1" "$work/moe.yaml" || fail "(f) the example changed: cut it again"
if timeout 300 "${mpirun_cmd[@]}" -np 8 "$shardscope" run "$work/moe.yaml" -o "$work/moe" -q --warmup 1 --steps 1 \
     --timeout 60 --time-scale 0 > "$work/moe.out" 2>&1; then
  "$python" - "$work/moe/report.json" <<'EOF_F' || fail "(f) moe-imbalance report"
import json, sys
run = json.load(open(sys.argv[1]))
if not (run["completed"] is True and run["world_size"] == 8 and all(r["finished"] for r in run["ranks"])):
    print("  (f) the run did not complete on 8 ranks"); sys.exit(1)
EOF_F
else
  fail "(f) mpirun -np 8 run of the cut moe-imbalance example failed: $(tail -5 "$work/moe.out")"
fi

if [ "$failures" -ne 0 ]; then
  echo "run_host_test: $failures failure(s)"
  exit 1
fi
echo "run_host_test: ok"
