#!/usr/bin/env bash
# Bad input gets a clear message naming the file, line and key, exit code 2, and no output
# file (not even a half-written one).
set -uo pipefail
bin=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0

expect() {  # expect NAME EXIT_CODE MESSAGE_REGEX -- args...
  local name=$1 code=$2 regex=$3
  shift 4
  local out
  out=$("$bin" "$@" 2>&1)
  local got=$?
  if [ "$got" -ne "$code" ]; then
    echo "FAIL $name: exit $got, expected $code; output: $out"
    failures=$((failures + 1))
  elif ! grep -Eq "$regex" <<<"$out"; then
    echo "FAIL $name: message does not match /$regex/: $out"
    failures=$((failures + 1))
  else
    echo "ok   $name"
  fi
}

printf 'model: llama3-8b\ncluster: {preset: dgx-a100, nodes: 1}\nstrategy: fsdp2\ntraining:\n  seq_len: -5\n' > "$work/negative.yaml"
printf 'model: llama3-8b\ncluster: {preset: dgx-a100, nodes: 1}\nstrategy: fsdp2\nbogus_key: 1\n' > "$work/unknown.yaml"
printf 'model: llama3-8b\ncluster: {preset: dgx-a100, nodes: 1\n' > "$work/syntax.yaml"
printf 'model: no-such-model\ncluster: {preset: dgx-a100, nodes: 1}\nstrategy: fsdp2\n' > "$work/model.yaml"
printf '{"version": 1, "programs": [' > "$work/truncated.json"
printf '{"version": 1, "metadata": {}, "communicators": [], "programs": [{"name": "p", "streams": [{"name": "s", "priority": 0}], "events": [], "tensors": [], "comm_slots": [], "ops": [{"id": 7, "op": "kernel", "stream": "nope", "fixed": {"duration_ns": 5}}]}], "ranks": [{"rank": 0, "program": "p"}]}' > "$work/badstream.json"

expect negative-value 2 "negative.yaml:5:.*training.seq_len" -- simulate "$work/negative.yaml" -o "$work/out1"
expect unknown-key 2 "unknown.yaml:4:.*bogus_key" -- simulate "$work/unknown.yaml" -o "$work/out2"
expect yaml-syntax 2 "syntax.yaml:[0-9]+" -- simulate "$work/syntax.yaml" -o "$work/out3"
expect unknown-model 2 "model.yaml:1:.*no-such-model" -- simulate "$work/model.yaml" -o "$work/out4"
expect truncated-json 2 "truncated.json:1:[0-9]+" -- simulate "$work/truncated.json" -o "$work/out5"
expect unknown-stream 2 "badstream.json.*op id 7.*nope" -- simulate "$work/badstream.json" -o "$work/out6"
expect missing-file 2 "does-not-exist.yaml" -- simulate "$work/does-not-exist.yaml" -o "$work/out7"
# The CUDA under PyTorch must run the GPU; a DDP module is never on the meta device.
printf 'model: llama3-8b\ncluster: {preset: dgx-a100, nodes: 1}\nstrategy: fsdp2\ntraining: {pytorch_version: "1.8", cuda_version: "10.2"}\n' > "$work/cuda.yaml"
expect old-cuda 2 "cuda.yaml:4:50: training.cuda_version: expected CUDA 11.0 or later" -- simulate "$work/cuda.yaml" -o "$work/out8"
printf 'model: llama3-8b\ncluster: {preset: dgx-a100, nodes: 1}\nstrategy: ddp\ntraining: {init: {device: meta}}\n' > "$work/meta.yaml"
expect ddp-meta 2 "meta.yaml:4:27: training.init.device: expected cpu or cuda with strategy ddp" -- simulate "$work/meta.yaml" -o "$work/out9"
# A framework config file the plan names: its errors name that file's line and key; a plan
# value that contradicts it names both places.
printf '{\n  "train_micro_batch_size_per_gpu": 1,\n  "zero_optimization": {"stage": 3, "bogus": 1}\n}\n' > "$work/ds.json"
printf 'model: llama3-8b\ncluster: {preset: dgx-a100, nodes: 1}\nzero: {deepspeed_config: ds.json}\n' > "$work/ds-unknown.yaml"
expect config-unknown-key 2 "ds.json:3:37: zero_optimization.bogus" -- simulate "$work/ds-unknown.yaml" -o "$work/out_ds1"
printf '{\n  "train_micro_batch_size_per_gpu": 1,\n  "zero_optimization": {"stage": 3}\n}\n' > "$work/ds2.json"
printf 'model: llama3-8b\ncluster: {preset: dgx-a100, nodes: 1}\nzero: {deepspeed_config: ds2.json}\ntraining: {micro_batch_size: 4}\n' > "$work/ds-conflict.yaml"
expect config-conflict 2 "ds-conflict.yaml:4:30: training.micro_batch_size.*ds2.json:2:3" -- simulate "$work/ds-conflict.yaml" -o "$work/out_ds2"
printf 'torchtitan: {job_config: nope.toml}\ncluster: {preset: dgx-a100, nodes: 1}\n' > "$work/tt-missing.yaml"
expect config-missing 2 "tt-missing.yaml:1:26: torchtitan.job_config.*nope.toml" -- simulate "$work/tt-missing.yaml" -o "$work/out_ds3"
# cluster.nccl: a name the NCCL release does not know, and knobs that leave a collective no
# algorithm (an error from NCCL 2.23, found before the simulation starts).
printf 'model: llama3-8b\ncluster:\n  preset: dgx-h100\n  nccl: {version: "2.21.5", NCCL_ALGO: "Ring,PAT"}\nstrategy: fsdp2\n' > "$work/nccl-algo.yaml"
expect nccl-unknown-algo 2 "nccl-algo.yaml:4:.*cluster.nccl.NCCL_ALGO.*PAT" -- simulate "$work/nccl-algo.yaml" -o "$work/out_nccl1"
printf 'model: llama3-8b\ncluster:\n  preset: dgx-h100\n  nccl: {version: "2.28.9", NCCL_ALGO: Tree}\nstrategy: fsdp2\n' > "$work/nccl-none.yaml"
expect nccl-no-algorithm 2 "nccl-none.yaml:4:.*cluster.nccl.NCCL_ALGO.*all_gather.*no algorithm/protocol available" -- simulate "$work/nccl-none.yaml" -o "$work/out_nccl2"
expect bad-rank-list 2 "trace-ranks" -- simulate examples/tiny-fsdp2-2gpu.yaml -o "$work/out8" --trace-ranks 5-9
expect no-subcommand 2 "subcommand" --
expect help 0 "Usage" -- simulate --help

for d in "$work"/out*; do
  if [ -e "$d" ] && [ -n "$(ls -A "$d")" ]; then
    echo "FAIL: $d holds files after a failed run: $(ls -A "$d")"
    failures=$((failures + 1))
  fi
done
echo "$failures failure(s)"
[ "$failures" -eq 0 ]
