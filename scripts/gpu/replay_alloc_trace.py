#!/usr/bin/env python3
"""Replays allocation traces (docs/ALLOC_TRACE.md) through PyTorch's real CUDA caching
allocator, to check shardscope's model of it (`shardscope alloc-replay`) on a GPU.

  replay_alloc_trace.py TRACE.json [TRACE.json ...] [--out DIR] [--snapshot]
                        [--compare PREDICTED.json ...]

For each trace, in a fresh process (PYTORCH_CUDA_ALLOC_CONF is read once, at CUDA
initialization, so every trace re-executes this script with the trace's configuration in
the environment):
  * the allocator may hold floor(memory_fraction * device_memory_bytes) bytes: the script
    sets torch.cuda.set_per_process_memory_fraction so that PyTorch's own limit,
    allowed_memory_maximum = size_t(fraction * device_total) with device_total from
    cudaMemGetInfo (c10/cuda/CUDACachingAllocator.cpp, setMemoryFraction), equals exactly that.
    The limit counts only the allocator's segments (total_allocated_memory); the CUDA
    context and the memory of other processes lie outside it, which is what we want, as
    long as the device has that much memory free (checked);
  * creates the trace's streams (index 0 is the current stream);
  * replays alloc / free with torch.cuda.caching_allocator_alloc / caching_allocator_delete
    on those streams. An id that a record_stream op names is allocated as a uint8 tensor
    under torch.cuda.stream() instead (the same CUDACachingAllocator malloc, but a tensor is
    what Tensor.record_stream needs), and after its free the script synchronizes the device,
    so that the events the allocator recorded have completed before the next call, as the
    model assumes. A failed alloc (torch.cuda.OutOfMemoryError) is recorded and replay goes
    on; frees of its id do nothing, as in the model. 0-byte allocs allocate nothing;
  * prints and writes the torch.cuda.memory_stats() keys the model predicts, the OOM op
    indices and reserved bytes after every op.

With --compare (one PREDICTED.json per trace, in the same order: the output of
`shardscope alloc-replay TRACE --json`) it prints predicted and measured side by side and
exits 1 if peak reserved bytes or num_alloc_retries differ for any trace (other rows are
shown for diagnosis). Exit 2: a trace could not be replayed (no GPU, bad file, not enough
free device memory).
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

# torch.cuda.memory_stats() keys written for each trace; the first two decide --compare.
DECIDING_KEYS = ["reserved_bytes.all.peak", "num_alloc_retries"]
SHOWN_KEYS = DECIDING_KEYS + [
    "allocated_bytes.all.peak",
    "num_ooms",
    "segment.all.peak",
    "reserved_bytes.all.current",
    "allocated_bytes.all.current",
    "segment.all.current",
    "active_bytes.all.peak",
    "inactive_split_bytes.all.peak",
    "requested_bytes.all.peak",
    "num_sync_all_streams",
    "num_device_alloc",
    "num_device_free",
]

EXIT_MISMATCH = 1
EXIT_CANNOT_RUN = 2


class CannotRun(Exception):
    pass


def load_trace(path):
    try:
        with open(path) as f:
            trace = json.load(f)
    except (OSError, ValueError) as e:
        raise CannotRun("%s: %s" % (path, e))
    for key in ("version", "device_memory_bytes", "streams", "ops"):
        if key not in trace:
            raise CannotRun("%s: key '%s' missing (see docs/ALLOC_TRACE.md)" % (path, key))
    if trace["version"] != 1:
        raise CannotRun("%s: key 'version': expected 1, got %r" % (path, trace["version"]))
    if trace.get("initial_segments") or trace.get("segment_addresses"):
        raise CannotRun("%s: a recorded initial state or segment addresses cannot be reproduced on a GPU "
                        "(model-only keys, docs/ALLOC_TRACE.md)" % path)
    return trace


def fraction_for(allowed_bytes, device_total):
    """The fraction f for which PyTorch's size_t(f * device_total) equals allowed_bytes.

    The product is taken in double precision in C++ and truncated; Python floats are the
    same IEEE doubles, so the search below reproduces it exactly."""
    f = allowed_bytes / device_total
    while int(f * device_total) < allowed_bytes:
        f = math.nextafter(f, math.inf)
    while int(f * device_total) > allowed_bytes:
        f = math.nextafter(f, 0.0)
    if int(f * device_total) != allowed_bytes:
        raise CannotRun("no memory fraction gives exactly %d of %d bytes" % (allowed_bytes, device_total))
    return min(f, 1.0)


def replay_in_this_process(trace_path, result_path, snapshot_path):
    """Child: CUDA has not been initialized and the environment holds the trace's config."""
    try:
        import torch
    except ImportError as e:
        raise CannotRun("PyTorch is needed on the GPU machine: %s" % e)

    trace = load_trace(trace_path)
    if not torch.cuda.is_available():
        raise CannotRun("torch.cuda.is_available() is False")
    device = 0
    torch.cuda.set_device(device)
    free_bytes, total_bytes = torch.cuda.mem_get_info(device)
    allowed = int(math.floor(trace.get("memory_fraction", 1.0) * trace["device_memory_bytes"]))
    if allowed > total_bytes:
        raise CannotRun("%s: the trace allows %d bytes but the device has %d" % (trace_path, allowed, total_bytes))
    if allowed > free_bytes:
        raise CannotRun("%s: the trace allows %d bytes but only %d are free on the device; an OOM would come "
                        "from the device rather than from the allocator's limit" % (trace_path, allowed, free_bytes))
    fraction = fraction_for(allowed, total_bytes)
    torch.cuda.set_per_process_memory_fraction(fraction, device)

    before = torch.cuda.memory_stats(device)
    if before.get("reserved_bytes.all.current", 0) != 0:
        raise CannotRun("the allocator already holds %d bytes before the replay" % before["reserved_bytes.all.current"])
    torch.cuda.reset_peak_memory_stats(device)

    streams = [torch.cuda.current_stream(device)]
    streams += [torch.cuda.Stream(device) for _ in range(trace["streams"] - 1)]
    tensor_ids = {op["id"] for op in trace["ops"] if op["op"] == "record_stream"}
    oom_error = getattr(torch.cuda, "OutOfMemoryError", RuntimeError)

    if snapshot_path:
        try:
            torch.cuda.memory._record_memory_history(max_entries=1000000)
        except (AttributeError, TypeError) as e:
            print("note: memory history unavailable (%s); no snapshot" % e, file=sys.stderr)
            snapshot_path = None

    live = {}  # id -> int pointer, or a tensor for ids that record_stream names
    used_elsewhere = set()
    ooms = []
    reserved_after_op = []
    for index, op in enumerate(trace["ops"]):
        kind = op["op"]
        if kind == "alloc":
            stream = streams[op["stream"]]
            try:
                if op["bytes"] == 0:
                    pass  # raw_alloc returns nullptr for 0 bytes: nothing to replay
                elif op["id"] in tensor_ids:
                    with torch.cuda.stream(stream):
                        live[op["id"]] = torch.empty(op["bytes"], dtype=torch.uint8, device="cuda")
                else:
                    live[op["id"]] = torch.cuda.caching_allocator_alloc(op["bytes"], device, stream)
            except oom_error as e:
                if oom_error is RuntimeError and "out of memory" not in str(e):
                    raise
                ooms.append({"op_index": index, "message": str(e).splitlines()[0]})
        elif kind == "free":
            handle = live.pop(op["id"], None)
            if isinstance(handle, int):
                torch.cuda.caching_allocator_delete(handle)
            elif handle is not None:
                del handle  # the last reference: the block goes back (deferred by events)
                if op["id"] in used_elsewhere:
                    # The model's events are complete when queried; make the real ones so.
                    torch.cuda.synchronize(device)
        elif kind == "record_stream":
            handle = live.get(op["id"])
            if handle is not None:
                handle.record_stream(streams[op["stream"]])
                used_elsewhere.add(op["id"])
        elif kind == "empty_cache":
            torch.cuda.empty_cache()
        else:
            raise CannotRun("%s: ops[%d]: unknown op %r" % (trace_path, index, kind))
        reserved_after_op.append(torch.cuda.memory_reserved(device))

    stats = torch.cuda.memory_stats(device)
    if snapshot_path:
        torch.cuda.memory._dump_snapshot(snapshot_path)
        torch.cuda.memory._record_memory_history(enabled=None)
    result = {
        "producer": "scripts/gpu/replay_alloc_trace.py",
        "trace": trace_path,
        "description": trace.get("description", ""),
        "alloc_conf": trace.get("alloc_conf", ""),
        "env": {k: os.environ.get(k) for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")},
        "memory_fraction": trace.get("memory_fraction", 1.0),
        "device_memory_bytes": trace["device_memory_bytes"],
        "allowed_bytes": allowed,
        "set_per_process_memory_fraction": fraction,
        "device": torch.cuda.get_device_name(device),
        "device_total_bytes": total_bytes,
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "num_ops": len(trace["ops"]),
        "memory_stats": {key: stats[key] for key in SHOWN_KEYS if key in stats},
        "oom_ops": ooms,
        "reserved_bytes_after_op": reserved_after_op,
    }
    with open(result_path, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")


def run_child(trace_path, snapshot_path):
    """Replays one trace in a fresh interpreter whose environment carries its alloc_conf."""
    trace = load_trace(trace_path)
    env = dict(os.environ)
    # Both names: newer PyTorch reads PYTORCH_ALLOC_CONF first, and an inherited value of
    # either must not leak into a trace that asks for something else.
    env["PYTORCH_CUDA_ALLOC_CONF"] = trace.get("alloc_conf", "")
    env["PYTORCH_ALLOC_CONF"] = trace.get("alloc_conf", "")
    with tempfile.TemporaryDirectory() as tmp:
        result_path = os.path.join(tmp, "result.json")
        command = [sys.executable, os.path.abspath(__file__), "--child", trace_path, "--result", result_path]
        if snapshot_path:
            command += ["--snapshot-path", snapshot_path]
        proc = subprocess.run(command, env=env)
        if proc.returncode != 0 or not os.path.exists(result_path):
            raise CannotRun("%s: the replay process exited %d" % (trace_path, proc.returncode))
        with open(result_path) as f:
            return json.load(f)


def print_measured(result):
    stats = result["memory_stats"]
    print("%s (%s, torch %s): %d ops, alloc_conf '%s', allowed %d bytes" % (
        result["trace"], result["device"], result["torch_version"], result["num_ops"], result["alloc_conf"],
        result["allowed_bytes"]))
    for key in SHOWN_KEYS[:5]:
        print("  %-28s %16s" % (key, stats.get(key, "n/a")))
    for oom in result["oom_ops"]:
        print("  OOM at ops[%d]: %s" % (oom["op_index"], oom["message"]))


def compare(predicted, measured):
    """Prints the side-by-side table; returns True when the deciding keys agree."""
    p_stats, m_stats = predicted.get("memory_stats", {}), measured["memory_stats"]
    print("  %-32s %16s %16s" % ("torch.cuda.memory_stats()", "shardscope", "PyTorch"))
    ok = True
    for key in SHOWN_KEYS:
        p, m = p_stats.get(key), m_stats.get(key)
        if p is None and m is None:
            continue
        same = p == m
        verdict = "" if same else ("MISMATCH" if key in DECIDING_KEYS else "differs")
        if not same and key not in DECIDING_KEYS and (p is None or m is None):
            verdict = ""  # a key one side does not report (an older PyTorch) is no finding
        if key in DECIDING_KEYS and not same:
            ok = False
        print("  %-32s %16s %16s  %s" % (key, "n/a" if p is None else p, "n/a" if m is None else m, verdict))
    p_ooms = [o["op_index"] for o in predicted.get("oom_ops", [])]
    m_ooms = [o["op_index"] for o in measured["oom_ops"]]
    print("  %-32s %16s %16s  %s" % ("OOM ops", p_ooms, m_ooms, "" if p_ooms == m_ooms else "differs"))
    p_after, m_after = predicted.get("reserved_bytes_after_op", []), measured["reserved_bytes_after_op"]
    for index, (p, m) in enumerate(zip(p_after, m_after)):
        if p != m:
            print("  reserved bytes first differ after ops[%d]: shardscope %d, PyTorch %d" % (index, p, m))
            break
    print("  => %s" % ("match" if ok else "MISMATCH (peak reserved bytes or num_alloc_retries)"))
    return ok


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", nargs="*", help="allocation trace JSON files")
    parser.add_argument("--compare", action="append", default=[],
                        help="`shardscope alloc-replay TRACE --json` output; once per trace, in order")
    parser.add_argument("--out", help="directory for NAME.measured.json (and snapshots)")
    parser.add_argument("--snapshot", action="store_true",
                        help="also write NAME.snapshot.pickle (torch.cuda.memory._dump_snapshot) under --out")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--snapshot-path", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        try:
            replay_in_this_process(args.child, args.result, args.snapshot_path)
        except CannotRun as e:
            print("replay_alloc_trace: error: %s" % e, file=sys.stderr)
            return EXIT_CANNOT_RUN
        return 0

    if not args.traces:
        parser.error("no trace given")
    if args.compare and len(args.compare) != len(args.traces):
        parser.error("--compare must be given once per trace (%d traces, %d --compare)" %
                     (len(args.traces), len(args.compare)))
    if args.snapshot and not args.out:
        parser.error("--snapshot needs --out")
    if args.out:
        os.makedirs(args.out, exist_ok=True)

    mismatches, failures = [], []
    for i, trace_path in enumerate(args.traces):
        name = os.path.splitext(os.path.basename(trace_path))[0]
        snapshot_path = os.path.join(args.out, name + ".snapshot.pickle") if args.snapshot else None
        try:
            measured = run_child(trace_path, snapshot_path)
        except CannotRun as e:
            print("replay_alloc_trace: error: %s" % e, file=sys.stderr)
            failures.append(trace_path)
            continue
        print_measured(measured)
        if args.out:
            with open(os.path.join(args.out, name + ".measured.json"), "w") as f:
                json.dump(measured, f, indent=2)
                f.write("\n")
        if args.compare:
            try:
                with open(args.compare[i]) as f:
                    predicted = json.load(f)
            except (OSError, ValueError) as e:
                print("replay_alloc_trace: error: %s: %s" % (args.compare[i], e), file=sys.stderr)
                failures.append(trace_path)
                continue
            if not compare(predicted, measured):
                mismatches.append(trace_path)
        print()

    if args.compare:
        print("%d trace(s): %d match, %d mismatch, %d could not run" % (
            len(args.traces), len(args.traces) - len(mismatches) - len(failures), len(mismatches), len(failures)))
    if failures:
        return EXIT_CANNOT_RUN
    return EXIT_MISMATCH if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
