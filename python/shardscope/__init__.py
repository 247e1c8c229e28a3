"""shardscope from Python: simulate sharded data-parallel training plans, run them on the
host backend, and compare predicted with measured timelines.

    import shardscope
    plan = shardscope.load_plan("examples/tiny-fsdp2-2gpu.yaml")   # or a dict
    run = shardscope.simulate(plan)
    print(run.report["step_time_ns"], run.summary)
    t, allocated, reserved = run.memory(0).values()

The module is a thin layer over the libraries the `shardscope` CLI is built from (the C++
extension `_shardscope`): every figure is the one the CLI writes for the same input, and
errors carry the CLI's messages (file:line:column: key: expected ..., got ...). The
reference is docs/PYTHON.md.
"""

import json
import math
import numbers
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence

from . import _shardscope as _core
from ._shardscope import Error, InputError, Plan, PlanError, __version__

try:  # numpy is optional: without it the arrays are plain lists
    import numpy as _np
except ImportError:  # pragma: no cover - Debian's python3-numpy is installed by scripts/setup.sh
    _np = None

__all__ = [
    "Error", "InputError", "PlanError", "Plan", "Simulation", "HostRun", "__version__",
    "load_plan", "plan_yaml", "simulate", "compare", "memory", "fit", "check",
    "import_traces", "read_trace", "analyze", "diff", "flight_recorder",
    "run_host", "mpirun_command", "cuda_command", "binary",
]


# ---- plans -------------------------------------------------------------------------------

_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")


def _yaml_key(key, path):
    if isinstance(key, bool) or not isinstance(key, (str, numbers.Integral)):
        raise InputError(f"{path or '(top level)'}: plan keys are strings (or rank numbers), got {key!r}")
    if isinstance(key, numbers.Integral):
        return str(int(key))
    return key if _PLAIN_KEY.match(key) else json.dumps(key, ensure_ascii=False)


def _yaml_scalar(value, path):
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        number = float(value)
        if math.isnan(number):
            return ".nan"
        if math.isinf(number):
            return ".inf" if number > 0 else "-.inf"
        return repr(number)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a JSON string is a YAML double-quoted scalar
    raise InputError(f"{path or '(top level)'}: a plan holds mappings, lists, strings, numbers, booleans "
                     f"and None, got a {type(value).__name__}")


def _yaml_lines(value, indent, path, lines):
    pad = " " * indent
    if isinstance(value, Mapping):
        for key, item in value.items():
            name = _yaml_key(key, path)
            where = f"{path}.{key}" if path else str(key)
            if isinstance(item, Mapping) and item or _is_list(item) and item:
                lines.append(f"{pad}{name}:")
                _yaml_lines(item, indent + 2, where, lines)
            else:
                lines.append(f"{pad}{name}: {_yaml_inline(item, where)}")
    else:
        for i, item in enumerate(value):
            where = f"{path}[{i}]"
            if isinstance(item, Mapping) and item or _is_list(item) and item:
                lines.append(f"{pad}-")
                _yaml_lines(item, indent + 2, where, lines)
            else:
                lines.append(f"{pad}- {_yaml_inline(item, where)}")


def _is_list(value):
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes, bytearray))


def _yaml_inline(value, path):
    if isinstance(value, Mapping):
        return "{}"
    if _is_list(value):
        return "[]"
    return _yaml_scalar(value, path)


def plan_yaml(plan: Mapping) -> str:
    """The YAML text a plan dict becomes: one key per line, in the dict's order, strings
    double-quoted. load_plan parses exactly this text, so the line numbers of its errors
    point into it."""
    if not isinstance(plan, Mapping):
        raise InputError(f"(top level): expected a mapping with keys model, cluster and strategy, got a "
                         f"{type(plan).__name__}")
    lines = []
    _yaml_lines(plan, 0, "", lines)
    return "\n".join(lines) + "\n"


def load_plan(source, name: str = "<dict>", *, force: bool = False) -> Plan:
    """A plan from a YAML file, a schedule JSON file, or a dict (given to the same parser as
    YAML text, named `name` in messages). Raises PlanError (an InputError) with the CLI's
    message for a bad plan. A Plan passes through unchanged.

    A plan whose schedule would hold more than the CLI's limit (8 GiB) is refused before it
    is lowered, naming the knob that drives its size, unless force=True (the CLI's --force);
    past 1 GiB it warns (a UserWarning). docs/PLAN.md, "How big a run may be".

    Relative paths inside a dict plan (hf_config, deepspeed_config, cluster.calibration) are
    taken from the working directory; inside a file, from the file's folder."""
    return _load(source, name, force, None)


def _load(source, name, force, simulate_ranks):
    # simulate_ranks: None, or what simulate will trace (a count, _DEFAULT_TRACE_RANKS or
    # _ALL_RANKS), so that its size is checked before the plan is lowered.
    if isinstance(source, Plan):
        return source
    if isinstance(source, Mapping):
        return _core._load_yaml(plan_yaml(source), name, bool(force), simulate_ranks)
    if isinstance(source, (str, os.PathLike)):
        return _core._load_path(os.fspath(source), bool(force), simulate_ranks)
    raise TypeError(f"load_plan: expected a path, a dict or a Plan, got a {type(source).__name__}")


# ---- arrays ------------------------------------------------------------------------------

def _array(values, dtype):
    return _np.asarray(values, dtype=dtype) if _np is not None else list(values)


# ---- simulate ----------------------------------------------------------------------------

class Simulation:
    """One simulated plan: what `shardscope simulate` writes, in memory.

    report     report.json as a dict (docs/REPORT.md)
    summary    the text `shardscope simulate` prints
    ranks      the traced ranks (the trace's ranks: by default the first node and every rank
               whose timeline differs)
    flight_recorder  {rank: Flight Recorder dump (dict)} for blocked ranks of a hang
    files      the files written (with output=...)
    """

    def __init__(self, plan: Plan, result: dict):
        self.plan = plan
        self.report = result["report"]
        self.summary = result["summary"]
        self.flight_recorder = dict(result["flight_recorder"])
        self.files = list(result["files"])
        self._timeline = result["timeline"]
        self.ranks = sorted(self._timeline)
        self._kinds = {}

    def _rank(self, rank):
        if rank not in self._timeline:
            raise InputError(f"rank {rank} is not traced (traced: {self.ranks}); simulate(..., trace_ranks=[...])")
        return self._timeline[rank]

    def memory(self, rank: int) -> dict:
        """The rank's allocator over time, one sample per allocation or free:
        {"time_ns", "allocated_bytes", "reserved_bytes"} (int64 arrays)."""
        track = self._rank(rank)["counters"].get("memory (bytes)", {})
        return {
            "time_ns": _array(track.get("time_ns", []), "int64"),
            "allocated_bytes": _array([int(v) for v in track.get("allocated", [])], "int64"),
            "reserved_bytes": _array([int(v) for v in track.get("reserved", [])], "int64"),
        }

    def spans(self, rank: int) -> dict:
        """Every span of the rank in the trace: {"op_id", "stream" (-1: host thread), "track",
        "kind" (the schedule op's kind: kernel, collective, memcpy, ...; "" for spans of no op),
        "name", "category", "start_ns", "duration_ns"}."""
        slices = self._rank(rank)["slices"]
        if rank not in self._kinds:
            self._kinds[rank] = {op["id"]: op["kind"] for op in self.plan.ops(rank)}
        kinds = self._kinds[rank]
        op_ids = slices.get("op_id", [])
        return {
            "op_id": _array(op_ids, "int64"),
            "stream": _array([tid - 1 for tid in slices.get("tid", [])], "int64"),
            "track": list(slices.get("thread", [])),
            "kind": [kinds.get(op_id, "") for op_id in op_ids],
            "name": list(slices.get("name", [])),
            "category": list(slices.get("category", [])),
            "start_ns": _array(slices.get("start_ns", []), "int64"),
            "duration_ns": _array(slices.get("duration_ns", []), "int64"),
        }

    def __repr__(self):
        return f"<shardscope.Simulation {self.plan.label}: step {self.report['step_time_ns'] / 1e6:.3f} ms>"


def simulate(plan, *, output=None, trace_ranks=None, stragglers=None, inject_oom=None, force=False) -> Simulation:
    """Simulates a plan (path, dict or Plan) as `shardscope simulate` does.

    output       a folder to write trace.json, report.json, snapshots and dumps into (as the
                 CLI's -o: the files replace the folder's previous set as one); None writes
                 nothing
    trace_ranks  None (the default ranks), "all", or a list of ranks
    stragglers   {rank: factor}: that rank's kernels and copies factor (1 to 1000) x slower
    inject_oom   (rank, op_id): that allocate op fails as an out-of-memory (Plan.ops lists ops)
    force        go on past the size limits (--force): a schedule over 8 GiB, a simulation
                 whose traced ranks would hold over 8 GiB or write a trace.json over 2 GiB
    """
    size_checked = not isinstance(plan, Plan)
    if trace_ranks is not None and trace_ranks != "all":
        trace_ranks = [int(r) for r in trace_ranks]
    traced = (_core._ALL_RANKS if trace_ranks == "all" else _core._DEFAULT_TRACE_RANKS if trace_ranks is None
              else len(trace_ranks))
    plan = _load(plan, "<dict>", force, traced)
    if trace_ranks == "all":
        trace_ranks = list(range(plan.world_size))
    result = _core._simulate(plan, trace_ranks, dict(stragglers or {}),
                             tuple(inject_oom) if inject_oom is not None else None,
                             os.fspath(output) if output is not None else None, bool(force), size_checked)
    return Simulation(plan, result)


def compare(a, b, *, force=False) -> dict:
    """Two plans simulated without traces: {"text": `simulate --compare`'s table,
    "reports": (report of a, report of b)}."""
    return _core._compare(load_plan(a, force=force), load_plan(b, force=force))


def memory(plan, ranks=None, *, force=False) -> dict:
    """`shardscope memory --json` as a dict (bytes by category at each rank's peak, headroom,
    retries, OOM, the GPU outside the allocator, the init phase), plus "text", the tables the
    CLI prints. ranks: None for the default ranks."""
    return _core._memory(load_plan(plan, force=force), None if ranks is None else [int(r) for r in ranks])


def fit(plan, search: str = "micro_batch_size", max_micro_batch=None, *, force=False) -> dict:
    """`shardscope fit`: {"dimension", "capacity_bytes", "candidates": [...], "best" (index or
    None), "reason", "text"}. search: micro_batch_size or activation_checkpointing."""
    return _core._fit(load_plan(plan, force=force), search, max_micro_batch)


def check(plan, *, oom_ranks=(), stragglers=None, watchdog_minutes=None, seq_len_factor=None, moe_load=None,
          held_gib=None, threads=None, force=False) -> dict:
    """`shardscope check`: {"verdict" (safe, hangs, baseline-hangs, baseline-oom),
    "baseline_step_ns", "cases": [{label, kind, rank, op_id, outcome, safe, where,
    blocked_ranks, step_ns, watchdog_fires_at_ns, cost_ns}], "text", "failure"}. Unset
    options take the CLI's defaults."""
    return _core._check(load_plan(plan, force=force), [int(r) for r in oom_ranks], dict(stragglers or {}),
                        watchdog_minutes, seq_len_factor, moe_load, held_gib, threads)


# ---- traces ------------------------------------------------------------------------------

def _paths(paths):
    if isinstance(paths, (str, os.PathLike)):
        return [os.fspath(paths)]
    return [os.fspath(p) for p in paths]


def import_traces(paths, output=None) -> dict:
    """`shardscope import`: PyTorch-profiler traces (one per rank) into one timeline.
    {"summary", "ranks", "steps", "warnings", "timeline": {rank: {"slices": columns,
    "counters": ...}}}; output writes DIR/trace.json."""
    return _core._import(_paths(paths), None if output is None else os.fspath(output))


def read_trace(path) -> dict:
    """Any trace as the diff reads it (a file, a folder with trace.json, a folder of per-rank
    files): {"source", "files": [{"name", "rank", "producer", "timeline"}]}."""
    return _core._read_trace(os.fspath(path))


def analyze(paths, *, rank=None, kernel_wait_threshold_us=None, include_last_step=False, exact_ns=False) -> dict:
    """`shardscope analyze --json` as a dict (HTA's metrics per rank), plus "text" and
    "warnings"."""
    return _core._analyze(_paths(paths), rank, kernel_wait_threshold_us, include_last_step, exact_ns)


def diff(predicted, measured, output, *, top=None, rank=None, full=False, step=None) -> dict:
    """`shardscope diff PREDICTED MEASURED -o OUTPUT`: {"report" (report.json), "headline",
    "predicted_step_note", "measured_step_note", "warnings", "errors" (every matched op:
    class, name, rank, op_id, predicted_ns, measured_ns, error_ns, start_shift_ns,
    contribution_ns), "critical_path_predicted", "critical_path_measured" (name, rank, op_id,
    class, start_ns, wait_ns, duration_ns per step; length_ns)}."""
    result = _core._diff(os.fspath(predicted), os.fspath(measured), os.fspath(output), top, rank, full, step)
    for key in ("errors", "critical_path_predicted", "critical_path_measured"):
        columns = result[key]
        for column, values in list(columns.items()):
            if isinstance(values, list) and values and isinstance(values[0], int):
                columns[column] = _array(values, "int64")
    return result


def flight_recorder(directory, prefix: str = "") -> dict:
    """`shardscope flight-recorder DIR --json` as a dict ({"hangs": [...]}), plus "text"."""
    return _core._flight_recorder(os.fspath(directory), prefix)


# ---- the host backend under mpirun -------------------------------------------------------

def binary() -> str:
    """The shardscope CLI this module was built with ($SHARDSCOPE_BINARY overrides it)."""
    if os.environ.get("SHARDSCOPE_BINARY"):
        return os.environ["SHARDSCOPE_BINARY"]
    from . import _build
    return _build.SHARDSCOPE_BINARY


def _plan_file(plan, output):
    """A path the CLI can read: the plan's own file, or the dict's YAML written into output."""
    if isinstance(plan, Mapping) or isinstance(plan, Plan) and plan.yaml:
        text = plan_yaml(plan) if isinstance(plan, Mapping) else plan.yaml
        path = os.path.join(output, "plan.yaml")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return path
    return plan.label if isinstance(plan, Plan) else os.fspath(plan)


def mpirun_command(np: int, args) -> list:
    """`mpirun -np N` + args; as root with --allow-run-as-root --oversubscribe (Open MPI
    refuses root without the first and more ranks than cores without the second)."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise Error("mpirun not found: install openmpi-bin (scripts/setup.sh)")
    command = [mpirun, "-np", str(int(np))]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command += ["--allow-run-as-root", "--oversubscribe"]
    return command + list(args)


class HostRun:
    """A `shardscope run --backend host` under mpirun.

    returncode, stdout, stderr, command  the process
    report       DIR/report.json (dict; None when the job wrote none)
    trace_path   DIR/trace.json (the measured host timeline; with profile=True)
    flight_recorder  {rank: dump (dict)} from DIR/flight_recorder/ (a hang)
    """

    def __init__(self, output, command, completed):
        self.output = output
        self.command = command
        self.returncode = completed.returncode
        self.stdout = completed.stdout
        self.stderr = completed.stderr
        report = os.path.join(output, "report.json")
        self.report = None
        if os.path.exists(report):
            with open(report, encoding="utf-8") as f:
                self.report = json.load(f)
        trace = os.path.join(output, "trace.json")
        self.trace_path = trace if os.path.exists(trace) else None
        self.flight_recorder = {}
        dumps = os.path.join(output, "flight_recorder")
        if os.path.isdir(dumps):
            for name in sorted(os.listdir(dumps)):
                match = re.match(r"rank_(\d+)\.json$", name)
                if match:
                    with open(os.path.join(dumps, name), encoding="utf-8") as f:
                        self.flight_recorder[int(match.group(1))] = json.load(f)

    def __repr__(self):
        return f"<shardscope.HostRun {self.output}: exit {self.returncode}>"


def run_host(plan, output, *, np=None, steps=None, warmup=None, timeout=None, time_scale=None, inject_oom=None,
             profile=True, quiet=True, force=False, wall_timeout=600) -> HostRun:
    """Runs the plan on the host backend (`mpirun -np N shardscope run PLAN -o OUTPUT
    --backend host`), one process per rank: streams as threads, MPI collectives on real
    buffers, the simulator's allocator policy; kernels busy-wait their predicted time x
    time_scale. A dict plan is written to OUTPUT/plan.yaml first. Options left None take the
    CLI's defaults. inject_oom=(rank, op_id) makes that allocate fail in the first measured
    step: the job hangs, the watchdog (after `timeout` s) writes Flight Recorder dumps and
    aborts it (a non-zero returncode is then the expected outcome, not an error). force: past
    the size limit (the CLI's --force)."""
    output = os.fspath(output)
    os.makedirs(output, exist_ok=True)
    loaded = load_plan(plan, force=force)
    path = _plan_file(plan, output)
    args = [binary(), "run", path, "-o", output, "--backend", "host"]
    for flag, value in (("--steps", steps), ("--warmup", warmup), ("--timeout", timeout),
                        ("--time-scale", time_scale)):
        if value is not None:
            args += [flag, str(value)]
    if inject_oom is not None:
        args += ["--inject-oom", f"{int(inject_oom[0])}:{int(inject_oom[1])}"]
    if profile:
        args.append("--profile")
    if quiet:
        args.append("--quiet")
    if force:
        args.append("--force")
    command = mpirun_command(np if np is not None else loaded.world_size, args)
    completed = subprocess.run(command, capture_output=True, text=True, timeout=wall_timeout, check=False)
    return HostRun(output, command, completed)


def cuda_command(plan_path, output, np: int) -> str:
    """The command line that runs the same plan on GPUs (`--backend cuda`, one process per
    GPU, CUPTI-profiled), as a string to show: it needs a node with NVIDIA GPUs and the
    CUDA, NCCL and CUPTI libraries."""
    return " ".join(["mpirun", "-np", str(int(np)), "shardscope", "run", os.fspath(plan_path), "-o",
                     os.fspath(output), "--backend", "cuda", "--profile"])
