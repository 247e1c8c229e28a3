#!/usr/bin/env bash
# Issue 17's hostile inputs, each through the CLI as a user meets it: every number bounded
# where it enters (schedule JSON, its metadata, allocation traces, calibration profiles, Kineto
# traces, flags) with exit 2 naming the path and key and nothing written; the size of a run
# known before it starts (--force to go on); output folders replaced as one set, untouched when
# a write fails; errors printed once under a launcher; progress honouring -q.
set -uo pipefail
bin=$(realpath "$1")
cd "$(dirname "$0")/../.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

# expect NAME EXIT_CODE MESSAGE_REGEX -- args...: the exit code, the message, and no folder
# or file named out-NAME left behind (commands below write to $work/out-NAME).
expect() {
  local name=$1 code=$2 regex=$3
  shift 4
  local out got
  out=$("$bin" "$@" 2>&1)
  got=$?
  if [ "$got" -ne "$code" ]; then
    fail "$name: exit $got, expected $code; output: $out"
  elif ! grep -Eq -- "$regex" <<<"$out"; then
    fail "$name: message does not match /$regex/: $out"
  elif [ "$code" -ne 0 ] && compgen -G "$work/out-$name*" > /dev/null; then
    fail "$name: left $(ls -d "$work"/out-"$name"*) behind"
  else
    echo "ok   $name"
  fi
}

# A valid two-rank schedule; SCHED with one fragment replaced introduces one bad value.
cat > "$work/base.json" <<'JSON'
{"version": 1,
 "metadata": {"cluster.preset": "dgx-a100", "cluster.nodes": "1"},
 "communicators": [{"name": "dp", "ranks": [0, 1]}],
 "programs": [{"name": "main",
   "streams": [{"name": "compute"}, {"name": "comm", "priority": -1}],
   "events": ["e0"], "tensors": ["t0"], "comm_slots": ["dp"],
   "ops": [
     {"id": 0, "op": "allocate", "tensor": "t0", "bytes": 1048576, "stream": "comm"},
     {"id": 1, "op": "collective", "type": "all_gather", "comm": "dp", "stream": "comm", "bytes": 1048576},
     {"id": 2, "op": "event_record", "event": "e0", "stream": "comm"},
     {"id": 3, "op": "stream_wait_event", "stream": "compute", "event": "e0"},
     {"id": 4, "op": "kernel", "stream": "compute", "gemm": {"m": 1024, "n": 1024, "k": 1024}},
     {"id": 5, "op": "host_work", "duration_ns": 1000},
     {"id": 6, "op": "free", "tensor": "t0"}]}],
 "ranks": [{"rank": 0, "program": "main"}, {"rank": 1, "program": "main"}]}
JSON
sched() {  # sched NAME FROM TO: base.json with FROM replaced by TO, as $work/NAME.json
  python3 - "$work/base.json" "$work/$1.json" "$2" "$3" <<'PY'
import sys
text = open(sys.argv[1]).read()
assert sys.argv[3] in text, sys.argv[3]
open(sys.argv[2], "w").write(text.replace(sys.argv[3], sys.argv[4], 1))
PY
}
expect base-schedule 0 "step" -- simulate -q "$work/base.json" -o "$work/base-out"

# ---- schedule JSON: every number bounded, at its path
sched host "\"duration_ns\": 1000" "\"duration_ns\": 9223372036854775807"
expect host-work-2^63 2 "host.json: /programs/0/ops/5/duration_ns \(op id 5\): expected an integer in \[0, 3600000000000\]" \
  -- simulate "$work/host.json" -o "$work/out-host-work-2^63"
sched alloc "\"bytes\": 1048576, \"stream\": \"comm\"" "\"bytes\": 9223372036854775807, \"stream\": \"comm\""
expect allocate-2^63 2 "/programs/0/ops/0/bytes \(op id 0\): expected an integer in \[0, 1125899906842624\]" \
  -- simulate "$work/alloc.json" -o "$work/out-allocate-2^63"
sched coll "\"comm\", \"bytes\": 1048576" "\"comm\", \"bytes\": 4611686018427387904"
expect collective-2^62 2 "/programs/0/ops/1/bytes \(op id 1\): expected an integer in \[0, 1125899906842624\]" \
  -- simulate "$work/coll.json" -o "$work/out-collective-2^62"
sched gemm "\"m\": 1024, \"n\": 1024, \"k\": 1024" "\"m\": 1073741824, \"n\": 1073741824, \"k\": 1073741824"
expect gemm-2^30 2 "/programs/0/ops/4/gemm/m \(op id 4\): expected an integer in \[1, 16777216\]" \
  -- simulate "$work/gemm.json" -o "$work/out-gemm-2^30"
sched operand "\"m\": 1024, \"n\": 1024, \"k\": 1024" "\"m\": 16777216, \"n\": 16777216, \"k\": 16777216, \"batch\": 2"
expect gemm-operand 2 "gemm operand A \(batch x m x k\) has 5.629e\+14 elements, more than the limit" \
  -- simulate "$work/operand.json" -o "$work/out-gemm-operand"
# ---- its metadata
sched flops "\"cluster.nodes\": \"1\"" "\"cluster.nodes\": \"1\", \"gpu.peak_flops_bf16\": \"0\", \"gpu.peak_flops_fp16\": \"0\""
expect peak-flops-0 2 "flops.json: /metadata: gpu.peak_flops_bf16 and gpu.peak_flops_fp16 are both 0" \
  -- simulate "$work/flops.json" -o "$work/out-peak-flops-0"
sched bw "\"cluster.nodes\": \"1\"" "\"cluster.nodes\": \"1\", \"gpu.hbm_bandwidth\": \"1000\""
expect bandwidth-1000 2 "bw.json: /metadata/gpu.hbm_bandwidth: expected a number in \[1e\+08, 1e\+14\], got \"1000\"" \
  -- simulate "$work/bw.json" -o "$work/out-bandwidth-1000"
sched bw0 "\"cluster.nodes\": \"1\"" "\"cluster.nodes\": \"1\", \"gpu.hbm_bandwidth\": \"0\""
expect bandwidth-0 2 "/metadata: cluster needs .* gpu.hbm_bandwidth > 0|/metadata/gpu.hbm_bandwidth" \
  -- simulate "$work/bw0.json" -o "$work/out-bandwidth-0"
# ---- a run past the simulated-time horizon (each value in bounds): 110 host-to-device copies
# of 2^50 bytes over PCIe at 1e8 B/s take 110 x 1.13e16 ns = 1.24e18 ns > 2^60 ns.
python3 - "$work/horizon.json" <<'PY'
import json, sys
ops = [{"id": i, "op": "memcpy", "kind": "h2d", "stream": "s", "bytes": 1 << 50} for i in range(110)]
json.dump({"version": 1, "metadata": {"cluster.preset": "dgx-a100", "cluster.nodes": "1", "gpu.pcie_bandwidth": "1e8"},
           "programs": [{"name": "p", "streams": [{"name": "s"}], "ops": ops}],
           "ranks": [{"rank": 0, "program": "p"}]}, open(sys.argv[1], "w"))
PY
expect horizon 2 "the simulated run passes 1152921504606846976 ns \(36 years\)" \
  -- simulate "$work/horizon.json" -o "$work/out-horizon"

# ---- flags
expect straggler-1e18 2 "--straggler: expected RANK:FACTOR with 0 <= RANK < 2 and 1 <= FACTOR <= 1000" \
  -- simulate "$work/base.json" --straggler 0:1e18 -o "$work/out-straggler-1e18"
expect straggler-twice 2 "--straggler: rank 0 given twice" \
  -- simulate "$work/base.json" --straggler 0:2 --straggler 0:3 -o "$work/out-straggler-twice"
expect trace-ranks-1-0 2 "--trace-ranks: '1-0' is an empty range \(write the lower rank first, like '0-1'\)" \
  -- simulate "$work/base.json" --trace-ranks 1-0 -o "$work/out-trace-ranks-1-0"
expect diff-rank-minus-1 2 "--rank: expected a rank >= 0, got -1" \
  -- diff "$work/base-out" "$work/base-out" --rank -1 -o "$work/out-diff-rank-minus-1"
expect analyze-rank-minus-1 2 "--rank: expected a rank >= 0, got -1" \
  -- analyze "$work/base-out/trace.json" --rank -1

# ---- allocation traces
printf '{"version": 1, "device_memory_bytes": 85899345920, "streams": 1, "ops": [{"op": "alloc", "id": 0, "bytes": 9223372036854775807, "stream": 0}]}' \
  > "$work/alloc_trace.json"
expect alloc-trace-2^63 2 "alloc_trace.json.*ops\[0\].*bytes.*expected an integer in \[0, 1125899906842624\]" \
  -- alloc-replay "$work/alloc_trace.json"

# ---- a Kineto trace with dur -5
printf '{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 100, "dur": -5}]}' \
  > "$work/negative_dur.json"
expect kineto-dur-minus-5 2 "negative_dur.json: /traceEvents/0/dur: expected a duration >= 0 us, got -5" \
  -- analyze "$work/negative_dur.json"
expect import-dur-minus-5 2 "/traceEvents/0/dur: expected a duration >= 0 us" \
  -- import "$work/negative_dur.json" -o "$work/out-import-dur-minus-5"

# ---- calibration profiles: errors at the profile's file, line and key (through a plan)
plan_with_profile() {  # plan_with_profile NAME PROFILE_TEXT
  printf '%s' "$2" > "$work/$1.profile.yaml"
  printf 'model: llama3-8b\ncluster: {preset: dgx-a100, calibration: %s.profile.yaml}\nstrategy: fsdp2\n' "$1" \
    > "$work/$1.yaml"
}
plan_with_profile eff 'version: 1
gpu: a100-sxm4-80gb
gemm:
  - {dtype: bf16, flops_decade: 9, efficiency: 5.0, points: 1, rms_relative_error: 0}
'
expect profile-efficiency-5 2 "eff.yaml:2:[0-9]+: cluster.calibration: .*eff.profile.yaml:4:[0-9]+: gemm\[0\].efficiency: expected a number <= 1" \
  -- simulate "$work/eff.yaml" -o "$work/out-profile-efficiency-5"
plan_with_profile dup 'version: 1
gpu: a100-sxm4-80gb
attention:
  - {dtype: bf16, pass: forward, efficiency: 0.5, points: 1, rms_relative_error: 0}
  - {dtype: bf16, pass: forward, efficiency: 0.6, points: 1, rms_relative_error: 0}
'
expect profile-duplicate-bucket 2 "dup.profile.yaml:5:[0-9]+: attention\[1\]: the bucket \(bf16, forward\) already calibrated by attention\[0\]" \
  -- simulate "$work/dup.yaml" -o "$work/out-profile-duplicate-bucket"
plan_with_profile key 'version: 1
gpu: a100-sxm4-80gb
gpu: a100-sxm4-80gb
'
expect profile-duplicate-key 2 "key.profile.yaml:3:1: \(top level\).gpu: key given twice" \
  -- simulate "$work/key.yaml" -o "$work/out-profile-duplicate-key"
plan_with_profile launch 'version: 1
gpu: a100-sxm4-80gb
launch_overhead_ns: {value: 1e20, points: 1, rms_relative_error: 0}
'
expect profile-launch-1e20 2 "launch.profile.yaml:3:[0-9]+: launch_overhead_ns.value: expected a number <= 1000000000" \
  -- simulate "$work/launch.yaml" -o "$work/out-profile-launch-1e20"

# ---- a GPU that leaves the allocator nothing: refused at load, at its key
printf 'model: llama3-8b\ncluster: {preset: dgx-a100, gpu_memory_gb: 0.5}\nstrategy: fsdp2\nallocator: {memory_reserved_by_others_gb: 1000}\n' \
  > "$work/capacity.yaml"
expect capacity 2 "capacity.yaml:4:[0-9]+: allocator.memory_reserved_by_others_gb: expected memory left for the caching allocator" \
  -- simulate "$work/capacity.yaml" -o "$work/out-capacity"

# ---- the size of a run, before it starts
accum() {  # accum N: examples/grad-accum/every-micro-batch.yaml with grad_accum_steps N, as $work/accumN.yaml
  sed "s/grad_accum_steps: [0-9]*/grad_accum_steps: $1/" examples/grad-accum/every-micro-batch.yaml > "$work/accum$1.yaml"
  grep -q "grad_accum_steps: $1," "$work/accum$1.yaml" || fail "accum$1.yaml: no grad_accum_steps to change"
}
# The estimate is the lowering's own count, extrapolated: ops(N) = ops(1) + (N - 1) x d, with d
# and ops(1) from real lowerings at 4 and 8 here; for N = 1,000,000 the refusal must name it.
accum 4; accum 8; accum 1000000; accum 1000
ops4=$("$bin" schedule "$work/accum4.yaml" -o "$work/accum4.json" | sed -E 's/.* ([0-9]+) ops in the first program/\1/')
ops8=$("$bin" schedule "$work/accum8.yaml" -o "$work/accum8.json" | sed -E 's/.* ([0-9]+) ops in the first program/\1/')
step=$(( (ops8 - ops4) / 4 ))
million=$(( ops4 - 3 * step + 999999 * step ))
[ $(( ops8 - ops4 )) -eq $(( 4 * step )) ] || fail "ops at 4 and 8 micro-batches ($ops4, $ops8) are not linear"
start=$(date +%s)
expect grad-accum-1e6 2 "accum1000000.yaml: training.grad_accum_steps 1000000 lowers to about $million ops \(~[0-9.]+ GiB in memory\), more than the 8.0 GiB limit; lower training.grad_accum_steps, or pass --force to go on" \
  -- simulate "$work/accum1000000.yaml" -o "$work/out-grad-accum-1e6"
[ $(( $(date +%s) - start )) -le 60 ] || fail "grad-accum-1e6: the refusal took over a minute"
expect grad-accum-1e6-check 2 "training.grad_accum_steps 1000000 .*--force" -- check "$work/accum1000000.yaml"
# 1,000 micro-batches: the schedule alone fits (a warning), four traced ranks' memory history
# would not: refused before lowering, naming --trace-ranks.
expect grad-accum-1e3-traced 2 "the simulation would hold about [0-9.]+ GiB in memory with 4 traced rank\(s\), more than the 8.0 GiB limit; trace fewer ranks \(--trace-ranks 0, or none\), lower training.grad_accum_steps, or pass --force to go on" \
  -- simulate "$work/accum1000.yaml" -o "$work/out-grad-accum-1e3-traced"

# ---- -q: nothing on stderr; without it, progress lines (stderr is not a terminal here)
# (check exits 1 for the tiny example: some injected faults hang; its one error line is the verdict.)
"$bin" check -q examples/tiny-fsdp2-2gpu.yaml > /dev/null 2> "$work/quiet.err"
[ -z "$(grep -v '^shardscope: error: [0-9]* of [0-9]* injected fault(s) hang$' "$work/quiet.err")" ] \
  || fail "check -q wrote to stderr: $(cat "$work/quiet.err")"
"$bin" check examples/tiny-fsdp2-2gpu.yaml > /dev/null 2> "$work/loud.err"
grep -q "^shardscope: check: " "$work/loud.err" || fail "check without -q printed no progress: $(cat "$work/loud.err")"
for cmd in "simulate -q examples/tiny-fsdp2-2gpu.yaml -o $work/q-sim" "memory -q examples/tiny-fsdp2-2gpu.yaml" \
           "diff -q $work/base-out $work/base-out -o $work/q-diff" "analyze -q $work/base-out/trace.json" \
           "import -q $work/base-out/trace.json -o $work/q-import"; do
  # shellcheck disable=SC2086
  "$bin" $cmd > /dev/null 2> "$work/q.err" || true
  [ ! -s "$work/q.err" ] || fail "'$cmd' wrote to stderr: $(cat "$work/q.err")"
done
echo "ok   quiet"

# ---- output folders: the second run's set replaces the first's; other files stay
"$bin" simulate -q examples/divergence/ddp-bucket-layout.yaml -o "$work/reused" > /dev/null
ls "$work/reused"/flight_recorder_rank*.json > /dev/null 2>&1 || fail "the hang example wrote no Flight Recorder dump"
echo "mine" > "$work/reused/notes.txt"
"$bin" simulate -q examples/tiny-fsdp2-2gpu.yaml -o "$work/reused" > /dev/null
if ls "$work/reused"/flight_recorder_rank*.json > /dev/null 2>&1; then fail "a stale Flight Recorder dump survived"; fi
ls "$work/reused"/memory_snapshot_rank[2-9]* > /dev/null 2>&1 && fail "a stale memory snapshot survived"
[ "$(cat "$work/reused/notes.txt")" = mine ] || fail "a file simulate does not own was touched"
grep -q '"world_size": 2' "$work/reused/report.json" || fail "report.json is not the second run's"
ls -A "$work/reused" | grep -q staging && fail "a staging folder was left in the output folder"
echo "ok   output-set"

# ---- a full disk: every write beyond the file-size limit fails (SIGXFSZ ignored, so write()
# returns EFBIG as it would ENOSPC): the command fails, and the folder is what it was.
"$bin" simulate -q examples/tiny-fsdp2-2gpu.yaml -o "$work/full" > /dev/null
echo "keep" > "$work/full/notes.txt"
before=$(cd "$work/full" && sha256sum $(ls | sort))
(trap '' XFSZ; ulimit -f 64; exec "$bin" simulate -q examples/small-fsdp2-8gpu.yaml -o "$work/full") > "$work/full.out" 2>&1
code=$?
[ "$code" -eq 1 ] || fail "full disk: exit $code, expected 1: $(cat "$work/full.out")"
after=$(cd "$work/full" && sha256sum $(ls | sort))
[ "$before" = "$after" ] || fail "full disk: the output folder changed"
ls -A "$work/full" | grep -q staging && fail "full disk: a staging folder was left behind"
ls -A "$work" | grep -q "shardscope-staging" && fail "full disk: a staging folder was left beside the output"
echo "ok   full-disk"

# ---- under a launcher: an error every rank meets alike is printed once, by rank 0
OMPI_COMM_WORLD_RANK=3 OMPI_COMM_WORLD_SIZE=4 "$bin" simulate "$work/capacity.yaml" -o "$work/l3" > "$work/l3.out" 2>&1
code=$?
[ "$code" -eq 2 ] || fail "launcher rank 3: exit $code, expected 2"
[ ! -s "$work/l3.out" ] || fail "launcher rank 3 printed: $(cat "$work/l3.out")"
OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=4 "$bin" simulate "$work/capacity.yaml" -o "$work/l0" > "$work/l0.out" 2>&1
grep -q "^shardscope: error: rank 0 (all 4 ranks stopped alike): .*capacity.yaml:4:" "$work/l0.out" \
  || fail "launcher rank 0: $(cat "$work/l0.out")"
[ "$(grep -c error "$work/l0.out")" -eq 1 ] || fail "launcher rank 0 printed more than one error"
echo "ok   launcher"

# ---- out of memory anywhere: one message, exit 1, no abort (not under the sanitizers, whose
# shadow memory needs more address space than the limit leaves)
if [ -z "${ASAN_OPTIONS:-}" ]; then
  (ulimit -v 1500000; exec "$bin" simulate --force -q "$work/accum1000000.yaml" -o "$work/out-oom") > "$work/oom.out" 2>&1
  code=$?
  [ "$code" -eq 1 ] || fail "out of memory: exit $code, expected 1: $(tail -3 "$work/oom.out")"
  grep -q "^shardscope: error: out of memory" "$work/oom.out" || fail "out of memory: $(tail -3 "$work/oom.out")"
  [ -e "$work/out-oom" ] && fail "out of memory: left an output folder"
  echo "ok   out-of-memory"
fi

[ $failures -eq 0 ] && echo "all input checks pass"
exit $((failures > 0))
