#!/usr/bin/python3
"""Writes the hand-designed allocation traces of tests/alloc_traces (docs/ALLOC_TRACE.md).

Each trace is built to exercise one part of PyTorch's caching-allocator policy, so that
replaying it on a GPU (scripts/gpu/replay_alloc_trace.py) checks that part of our model:

  fragmentation.json             growing requests and interleaved 1-10 MiB / >10 MiB sizes
                                 whose frees leave holes the next, larger request cannot use
  fragmentation_expandable.json  the same ops with expandable_segments:True
  retry.json                     cached segments must be released to satisfy a request
                                 (num_alloc_retries >= 1, no OOM); also record_stream and
                                 empty_cache
  oom.json                       ends in an allocation that fails even after the release

Standard library only; deterministic (no randomness). Run from anywhere:
  /usr/bin/python3 tests/alloc_traces/make_traces.py [OUTPUT_DIR]
"""

import json
import os
import sys

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30


class Trace:
    """Builds the ops of one trace; ids are handed out in allocation order."""

    def __init__(self, description, device_memory_bytes, streams, alloc_conf="expandable_segments:False"):
        self.header = {
            "version": 1,
            "description": description,
            "alloc_conf": alloc_conf,
            "memory_fraction": 1.0,
            "device_memory_bytes": device_memory_bytes,
            "streams": streams,
        }
        self.ops = []
        self.next_id = 0

    def alloc(self, nbytes, stream=0):
        op_id = self.next_id
        self.next_id += 1
        self.ops.append({"op": "alloc", "id": op_id, "bytes": nbytes, "stream": stream})
        return op_id

    def free(self, op_id):
        self.ops.append({"op": "free", "id": op_id})

    def record_stream(self, op_id, stream):
        self.ops.append({"op": "record_stream", "id": op_id, "stream": stream})

    def empty_cache(self):
        self.ops.append({"op": "empty_cache"})

    def to_json(self, **overrides):
        """The layout `shardscope` writes (AllocTraceToJson): one op per line."""
        header = dict(self.header, **overrides)
        lines = ["{"]
        for key, value in header.items():
            lines.append("  %s: %s," % (json.dumps(key), json.dumps(value)))
        lines.append('  "ops": [')
        lines.append(",\n".join("    " + json.dumps(op) for op in self.ops))
        lines.append("  ]")
        lines.append("}")
        return "\n".join(lines) + "\n"


def fragmentation():
    """Default policy: a request >= 10 MiB gets a segment of its own size (rounded to 2 MiB),
    and a cached segment only serves requests no larger than it, so each growing request
    leaves the previous segment cached but unusable. 1-10 MiB requests share 20 MiB
    segments; freeing every other one leaves holes. Expandable segments grow one mapped
    range per stream instead, so a freed block at its end is extended rather than replaced."""
    t = Trace("fragmentation: growing >10 MiB requests interleaved with 1-10 MiB ones, frees leave holes",
              device_memory_bytes=16 * GIB, streams=1)
    # Phase 1: interleave mid (1-10 MiB) and large (> 10 MiB) sizes, then free all large
    # ones and every other mid one.
    mids, larges = [], []
    for i in range(12):
        mids.append(t.alloc(1 * MIB + 512 * KIB + i * 640 * KIB + 100))  # 1.5 .. 8.4 MiB
        larges.append(t.alloc(11 * MIB + i * 3 * MIB + 4096))            # 11 .. 44 MiB
    for op_id in larges:
        t.free(op_id)
    for op_id in mids[::2]:
        t.free(op_id)
    # Phase 2: a growing buffer (a longer sequence each step), freed just before the next,
    # larger one is allocated; every third step keeps a mid-size block alive (an activation
    # saved for backward), which lands in whatever hole fits it.
    kept = []
    previous = None
    for step in range(16):
        if previous is not None:
            t.free(previous)
        previous = t.alloc(48 * MIB + step * 7 * MIB + 3 * KIB)  # 48 .. 153 MiB
        activation = t.alloc(2 * MIB + (step % 5) * 1536 * KIB)  # 2 .. 8 MiB
        if step % 3 == 0:
            kept.append(activation)
        else:
            t.free(activation)
    t.free(previous)
    # Phase 3: one request larger than anything cached.
    t.alloc(200 * MIB)
    return t


def retry():
    """2 GiB device. Stream 0 caches 600 and 300 MiB segments, stream 1 a 700 MiB one; a 5 MiB
    request splits the 300 MiB segment (so it cannot be released). A 1000 MiB request on
    stream 0 fits no cached block and cudaMalloc would pass 2 GiB (1600 + 1000 MiB): the
    allocator releases every unsplit cached segment (600 and 700 MiB) and retries."""
    t = Trace("retry: cached segments must be released to fit a request (num_alloc_retries >= 1, no OOM)",
              device_memory_bytes=2 * GIB, streams=2)
    a = t.alloc(600 * MIB, stream=0)
    b = t.alloc(300 * MIB, stream=0)
    t.free(a)
    t.free(b)
    c = t.alloc(700 * MIB, stream=1)
    t.free(c)
    d = t.alloc(5 * MIB, stream=0)
    e = t.alloc(1000 * MIB, stream=0)  # the retry
    # A block used on stream 1 returns to stream 0's pool only after stream 1's event.
    f = t.alloc(50 * MIB, stream=0)
    t.record_stream(f, 1)
    t.free(f)
    g = t.alloc(50 * MIB, stream=0)
    t.free(d)
    t.free(e)
    t.free(g)
    t.empty_cache()
    t.alloc(1500 * MIB, stream=1)  # fits only because empty_cache released everything
    return t


def oom():
    """2 GiB device. 700 MiB (stream 0) and 500 MiB (stream 1) stay allocated; a freed 4 MiB
    block leaves a 20 MiB segment cached. 900 MiB more does not fit even after that segment
    is released (700 + 500 + 900 > 2048 MiB): an OOM, the last op."""
    t = Trace("oom: the last allocation fails even after releasing the cache", device_memory_bytes=2 * GIB, streams=2)
    t.alloc(700 * MIB, stream=0)
    small = t.alloc(4 * MIB, stream=0)
    t.alloc(500 * MIB, stream=1)
    t.free(small)
    t.alloc(900 * MIB, stream=0)
    return t


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    frag = fragmentation()
    outputs = {
        "fragmentation.json": frag.to_json(),
        "fragmentation_expandable.json": frag.to_json(
            alloc_conf="expandable_segments:True",
            description=frag.header["description"] + " (expandable_segments:True twin of fragmentation.json)"),
        "retry.json": retry().to_json(),
        "oom.json": oom().to_json(),
    }
    for name, text in outputs.items():
        with open(os.path.join(out_dir, name), "w") as f:
            f.write(text)
        print("wrote", os.path.join(out_dir, name))


if __name__ == "__main__":
    main()
