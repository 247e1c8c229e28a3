#!/usr/bin/env bash
# `shardscope tune` as a user runs it: a ranked search whose best.yaml simulates to the step it
# was ranked by, the same ranking.json on one thread, two threads and two MPI processes, exit 1
# with the reasons when nothing fits, exit 2 and nothing written on bad options.
set -euo pipefail
bin=$1
cd "$(dirname "$0")/../.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
fail() { echo "FAIL: $*"; status=1; }

plan=examples/small-fsdp2-8gpu.yaml
search=(--search strategy,ac,reshard --gpus 16 --global-batch 32)
"$bin" tune "$plan" "${search[@]}" -q --threads 1 -o "$work/one" > "$work/one.txt" || fail "tune exits $? on a plan that fits"
grep -q "^  best: " "$work/one.txt" || fail "no best line"; grep -q "Pareto front" "$work/one.txt" || fail "no Pareto front"
[ -s "$work/one/best.yaml" ] && [ -s "$work/one/ranking.json" ] || fail "-o did not write best.yaml and ranking.json"
# best.yaml is a plan simulate reads, and it predicts the step tune ranked it by.
"$bin" simulate "$work/one/best.yaml" -q --trace-ranks none -o "$work/best" > /dev/null || fail "best.yaml does not simulate"
ranked=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['ranking'][0]['step_time_ns'])" "$work/one/ranking.json")
simulated=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['step_time_ns'])" "$work/best/report.json")
[ "$ranked" = "$simulated" ] || fail "best.yaml simulates to $simulated ns, tune ranked it at $ranked ns"
# The same search on two threads, and split over two processes.
"$bin" tune "$plan" "${search[@]}" -q --threads 2 -o "$work/two" > /dev/null
cmp -s "$work/one/ranking.json" "$work/two/ranking.json" || fail "ranking.json differs between 1 and 2 threads"
if command -v mpirun > /dev/null; then
  # Open MPI's components are dlopen'ed and closed before LeakSanitizer runs, so their leaks
  # show as "<unknown module>" and cannot be suppressed by library (as in run_host_test.sh):
  # leak detection is off for this MPI run only; ASan's memory errors and UBSan stay on.
  if ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" timeout 300 mpirun --allow-run-as-root --oversubscribe -np 2 "$bin" tune "$plan" "${search[@]}" -q --threads 1 \
      -o "$work/mpi" > "$work/mpi.txt" 2> "$work/mpi.err"; then
    cmp -s "$work/one/ranking.json" "$work/mpi/ranking.json" || fail "ranking.json differs under mpirun -np 2"
    [ "$(grep -c '^  best: ' "$work/mpi.txt")" = 1 ] || fail "under mpirun the table must be printed once"
  else
    fail "tune under mpirun -np 2 failed: $(cat "$work/mpi.err")"
  fi
fi
# A budget leaves candidates unsimulated and says so.
"$bin" tune "$plan" "${search[@]}" -q --budget 5 > "$work/budget.txt" || true
grep -q "left when the budget ran out" "$work/budget.txt" || fail "a budget of 5 simulations does not say it ran out"
# Llama-3-8B fits on no 4 GiB GPUs: exit 1, and every family says why.
printf 'model: llama3-8b\ncluster: {preset: dgx-a100, nodes: 1, gpu_memory_gb: 4}\nstrategy: fsdp2\ntraining: {seq_len: 4096}\n' \
  > "$work/tiny-gpu.yaml"
set +e
"$bin" tune "$work/tiny-gpu.yaml" --gpus 8 --search strategy -q > "$work/none.txt" 2> "$work/none.err"
rc=$?
set -e
[ $rc -eq 1 ] || fail "a plan no candidate of fits exits $rc, not 1"
grep -q "none kept: " "$work/none.txt" || fail "the rejected families are not explained: $(cat "$work/none.txt")"
# Bad options: exit 2, a message naming the option, nothing written.
for args in "--gpus 12" "--gpus 16 --search strategy,tensor" "--gpus 16 --budget 5x" "--gpus 16 --global-batch 20" \
    "--gpus 16 --top 0"; do
  set +e
  # shellcheck disable=SC2086
  "$bin" tune "$plan" $args -q -o "$work/bad" > /dev/null 2> "$work/bad.err"
  rc=$?
  set -e
  [ $rc -eq 2 ] || fail "tune $args exits $rc, not 2"
  [ -e "$work/bad" ] && fail "tune $args wrote $work/bad"
  grep -q -- "$(echo "$args" | awk '{print $(NF-1)}')" "$work/bad.err" || fail "tune $args: the message does not name the option: $(cat "$work/bad.err")"
done
[ $status -eq 0 ] && echo "tune: ranks, writes a best.yaml that simulates to its rank, is deterministic over threads and processes, explains rejections, refuses bad options"
exit $status
