"""Unit tests of the shardscope Python module (ctest: python_module, label "python").

Each figure the module returns is checked against what the shardscope CLI prints or writes for
the same input: the module must hold no logic of its own, so any difference is a defect. Run
from the repository root with PYTHONPATH=build/python and Debian's /usr/bin/python3.
"""

import json
import os
import re
import subprocess
import tempfile
import unittest

import shardscope

TINY = "examples/tiny-fsdp2-2gpu.yaml"

# examples/tiny-fsdp2-2gpu.yaml as a dict, key for key.
TINY_DICT = {
    "model": {"name": "tiny", "layers": 2, "hidden": 256, "heads": 4, "ffn": 688, "vocab": 1000},
    "cluster": {"preset": "dgx-a100", "nodes": 1, "gpus_per_node": 2},
    "strategy": "fsdp2",
    "training": {"seq_len": 128, "micro_batch_size": 1, "grad_accum_steps": 1,
                 "activation_checkpointing": "none", "dtype": "bf16"},
    "fsdp2": {"reshard_after_forward": True},
}


def cli(*args, check=True):
    """The CLI this module was built with, as a user runs it."""
    completed = subprocess.run([shardscope.binary(), *args], capture_output=True, text=True, check=False)
    if check and completed.returncode != 0:
        raise AssertionError(f"shardscope {' '.join(args)}: exit {completed.returncode}: {completed.stderr}")
    return completed


def cli_error(args):
    """The message after 'shardscope: error: ' of a failing CLI run."""
    completed = cli(*args, check=False)
    assert completed.returncode == 2, (completed.returncode, completed.stderr)
    return completed.stderr.strip().removeprefix("shardscope: error: ")


class PlanTest(unittest.TestCase):
    def test_load_from_path(self):
        plan = shardscope.load_plan(TINY)
        self.assertEqual(plan.world_size, 2)
        self.assertEqual(plan.strategy, "fsdp2")
        self.assertEqual(plan.label, TINY)
        self.assertTrue(plan.is_plan)

    def test_dict_becomes_the_same_plan(self):
        # The same plan from the file and from the dict: every report figure equal, only the
        # source named differently.
        from_file = shardscope.simulate(TINY).report
        from_dict = shardscope.simulate(TINY_DICT).report
        self.assertEqual(from_dict.pop("source"), "<dict>")
        from_file.pop("source")
        self.assertEqual(from_dict, from_file)

    def test_yaml_text_of_a_dict(self):
        text = shardscope.plan_yaml({"model": "llama3-8b", "cluster": {"preset": "dgx-a100", "nodes": 2},
                                     "divergence": {"slowdown": {3: 1.5}}, "note": "a: b", "list": [1, {"x": None}]})
        self.assertEqual(text, 'model: "llama3-8b"\ncluster:\n  preset: "dgx-a100"\n  nodes: 2\ndivergence:\n'
                               '  slowdown:\n    3: 1.5\nnote: "a: b"\nlist:\n  - 1\n  -\n    x: null\n')
        # Strings stay strings whatever they hold: JSON's escapes are YAML double-quoted ones.
        self.assertEqual(shardscope.plan_yaml({"a b": "line\n\"é\"", "t": "true", "e": {}, "l": []}),
                         '"a b": "line\\n\\"é\\""\nt: "true"\ne: {}\nl: []\n')

    def test_bad_plan_dict_raises_the_clis_message(self):
        bad = json.loads(json.dumps(TINY_DICT))
        bad["training"]["seq_len"] = -128
        with self.assertRaises(shardscope.PlanError) as raised:
            shardscope.load_plan(bad)
        message = str(raised.exception)
        # plan_yaml writes model (7 lines), cluster (4), strategy (1), then training on line 13
        # and seq_len on line 14, its value at column 12 ("  seq_len: " is 11 characters).
        self.assertTrue(message.startswith("<dict>:14:12: training.seq_len: expected"), message)
        self.assertTrue(message.endswith("got '-128'"), message)
        # The same text as a file gives the CLI's message, file name aside.
        with tempfile.TemporaryDirectory() as work:
            path = os.path.join(work, "bad.yaml")
            with open(path, "w", encoding="utf-8") as f:
                f.write(shardscope.plan_yaml(bad))
            self.assertEqual(cli_error(["simulate", "-q", path, "-o", os.path.join(work, "out")]).replace(path, "<dict>"),
                             message)
        # PlanError is an InputError is an Error.
        self.assertTrue(issubclass(shardscope.PlanError, shardscope.InputError))
        self.assertTrue(issubclass(shardscope.InputError, shardscope.Error))

    def test_unknown_key_is_named(self):
        bad = dict(TINY_DICT, fsdp2={"reshard_after_froward": True})
        with self.assertRaises(shardscope.PlanError) as raised:
            shardscope.load_plan(bad)
        self.assertRegex(str(raised.exception), r"^<dict>:\d+:\d+: fsdp2\.reshard_after_froward: ")

    def test_value_a_plan_cannot_hold(self):
        with self.assertRaises(shardscope.InputError) as raised:
            shardscope.load_plan(dict(TINY_DICT, training={"seq_len": {1, 2}}))
        self.assertIn("training.seq_len", str(raised.exception))

    def test_missing_file(self):
        with self.assertRaises(shardscope.Error):
            shardscope.load_plan("no/such/plan.yaml")


class SimulateTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.work = tempfile.TemporaryDirectory()
        cls.cli_dir = os.path.join(cls.work.name, "cli")
        cls.cli_out = cli("simulate", TINY, "-q", "-o", cls.cli_dir).stdout
        cls.sim = shardscope.simulate(TINY, output=os.path.join(cls.work.name, "module"))

    @classmethod
    def tearDownClass(cls):
        cls.work.cleanup()

    def test_report_is_the_clis(self):
        with open(os.path.join(self.cli_dir, "report.json"), encoding="utf-8") as f:
            self.assertEqual(self.sim.report, json.load(f))

    def test_files_are_the_clis(self):
        for name in ("report.json", "trace.json"):
            with open(os.path.join(self.cli_dir, name), "rb") as a, \
                    open(os.path.join(self.work.name, "module", name), "rb") as b:
                self.assertEqual(a.read(), b.read(), name)

    def test_summary_is_what_the_cli_prints(self):
        self.assertEqual(self.sim.summary, self.cli_out[:self.cli_out.index("  wrote ")])

    def test_memory_over_time_peaks_where_the_report_says(self):
        self.assertEqual(self.sim.ranks, [0, 1])
        for rank in self.sim.ranks:
            memory = self.sim.memory(rank)
            self.assertEqual(len(memory["time_ns"]), len(memory["reserved_bytes"]))
            self.assertGreater(len(memory["time_ns"]), 0)
            peak = self.sim.report["ranks"][rank]
            self.assertEqual(int(max(memory["reserved_bytes"])), peak["peak_reserved_bytes"])
            self.assertEqual(int(max(memory["allocated_bytes"])), peak["peak_allocated_bytes"])

    def test_spans_are_the_schedules_ops(self):
        spans = self.sim.spans(0)
        ops = {op["id"]: op for op in self.sim.plan.ops(0)}
        kernels = [i for i, kind in enumerate(spans["kind"]) if kind == "kernel" and spans["stream"][i] >= 0]
        self.assertGreater(len(kernels), 0)
        for i in kernels:
            self.assertEqual(ops[int(spans["op_id"][i])]["kind"], "kernel")
            self.assertGreaterEqual(int(spans["duration_ns"][i]), 0)
        # Every device span ends by the step's end.
        end = max(int(s) + int(d) for s, d, st in zip(spans["start_ns"], spans["duration_ns"], spans["stream"])
                  if st >= 0)
        self.assertLessEqual(end, self.sim.report["step_time_ns"])

    def test_untraced_rank(self):
        run = shardscope.simulate(TINY, trace_ranks=[1])
        self.assertEqual(run.ranks, [1])
        with self.assertRaises(shardscope.InputError):
            run.memory(0)

    def test_injected_oom_hangs_with_dumps(self):
        allocate = next(op for op in shardscope.load_plan(TINY).ops(0)
                        if op["kind"] == "allocate" and op["phase"] == "backward")
        run = shardscope.simulate(TINY, inject_oom=(0, allocate["id"]))
        self.assertTrue(run.report["hang"])
        self.assertIn("hang_report", run.report)
        self.assertIn(1, run.flight_recorder)  # rank 1 waits for rank 0
        with tempfile.TemporaryDirectory() as work:
            cli("simulate", TINY, "-q", "-o", work, "--inject-oom", f"0:{allocate['id']}", check=False)
            with open(os.path.join(work, "report.json"), encoding="utf-8") as f:
                self.assertEqual(run.report, json.load(f))
            for rank, dump in run.flight_recorder.items():
                with open(os.path.join(work, f"flight_recorder_rank{rank}.json"), encoding="utf-8") as f:
                    self.assertEqual(dump, json.load(f))
            self.assertEqual(len([n for n in os.listdir(work) if n.startswith("flight_recorder_rank")]),
                             len(run.flight_recorder))

    def test_bad_inject_oom(self):
        kernel = next(op for op in shardscope.load_plan(TINY).ops(0) if op["kind"] == "kernel")
        with self.assertRaises(shardscope.InputError) as raised:
            shardscope.simulate(TINY, inject_oom=(0, kernel["id"]))
        self.assertEqual(str(raised.exception),
                         f"inject_oom: expected (rank, op_id) of an allocate op in that rank's program (Plan.ops(rank) "
                         f"lists them), got (0, {kernel['id']}): op {kernel['id']} is a kernel, not an allocate")
        with self.assertRaises(shardscope.InputError):
            shardscope.simulate(TINY, inject_oom=(2, kernel["id"]))

    def test_bad_straggler(self):
        with self.assertRaises(shardscope.InputError):
            shardscope.simulate(TINY, stragglers={5: 2.0})
        # The engine's bound on a slowdown (kMaxRankSlowdownFactor), as --straggler has it.
        with self.assertRaises(shardscope.InputError) as raised:
            shardscope.simulate(TINY, stragglers={1: 1001.0})
        self.assertEqual(str(raised.exception),
                         "stragglers: expected {rank: factor} with 0 <= rank < 2 and 1 <= factor <= 1000, got {1: 1001}")

    def test_output_folder_is_replaced_as_one_set(self):
        # As `simulate -o` (base/output_dir.h): a second run into the folder leaves exactly its
        # own set there (no Flight Recorder dump of the first run's hang) and every file it does
        # not own untouched.
        allocate = next(op for op in shardscope.load_plan(TINY).ops(0)
                        if op["kind"] == "allocate" and op["phase"] == "backward")
        with tempfile.TemporaryDirectory() as work:
            first = shardscope.simulate(TINY, output=work, inject_oom=(0, allocate["id"]))
            self.assertTrue(any(os.path.basename(p).startswith("flight_recorder_rank") for p in first.files))
            with open(os.path.join(work, "notes.txt"), "w", encoding="utf-8") as f:
                f.write("not the module's\n")
            second = shardscope.simulate(TINY, output=work)
            self.assertFalse(any(os.path.basename(p).startswith("flight_recorder_rank") for p in second.files))
            self.assertEqual(sorted(os.listdir(work)), sorted([os.path.basename(p) for p in second.files] + ["notes.txt"]))


class SizeLimitTest(unittest.TestCase):
    """The CLI's size limits (sim/lowering/work_limits.h, docs/PLAN.md "How big a run may be"):
    the module refuses what the CLI refuses, before lowering, with the CLI's message naming the
    module's arguments (force=True for --force, trace_ranks for --trace-ranks)."""

    @classmethod
    def setUpClass(cls):
        # examples/grad-accum/every-micro-batch.yaml with more micro-batches, as
        # tests/cli/inputs_test.sh makes them (it checks the estimate against real lowerings).
        cls.work = tempfile.TemporaryDirectory()
        with open("examples/grad-accum/every-micro-batch.yaml", encoding="utf-8") as f:
            text = f.read()
        cls.plans = {}
        for steps in (1000, 1000000):
            changed = re.sub(r"grad_accum_steps: [0-9]+", f"grad_accum_steps: {steps}", text)
            assert changed != text
            cls.plans[steps] = os.path.join(cls.work.name, f"accum{steps}.yaml")
            with open(cls.plans[steps], "w", encoding="utf-8") as f:
                f.write(changed)

    @classmethod
    def tearDownClass(cls):
        cls.work.cleanup()

    def test_a_schedule_too_big_to_hold(self):
        # 1,000,000 micro-batches: ~10^10 ops, far past 8 GiB.
        path = self.plans[1000000]
        expected = cli_error(["simulate", "-q", path, "-o", os.path.join(self.work.name, "out")])
        self.assertIn("lower training.grad_accum_steps, or pass --force to go on", expected)
        for load in (lambda: shardscope.load_plan(path), lambda: shardscope.simulate(path),
                     lambda: shardscope.memory(path)):
            with self.assertRaises(shardscope.PlanError) as raised:
                load()
            self.assertEqual(str(raised.exception), expected.replace("--force", "force=True"))

    def test_a_simulation_too_big_to_trace(self):
        # 1,000 micro-batches: the schedule alone fits (a warning past 1 GiB), the memory
        # history of the four traced ranks (the first node) would not.
        path = self.plans[1000]
        out = os.path.join(self.work.name, "out")
        expected = cli_error(["simulate", "-q", path, "-o", out])
        self.assertIn("trace fewer ranks (--trace-ranks 0, or none)", expected)
        warning = next(line for line in cli("simulate", path, "-o", out, check=False).stderr.splitlines()
                       if line.startswith("shardscope: warning: "))
        with self.assertWarns(UserWarning) as warned, self.assertRaises(shardscope.PlanError) as raised:
            shardscope.simulate(path)
        self.assertEqual(str(raised.exception),
                         expected.replace("--trace-ranks 0, or none", "trace_ranks=[0], or []")
                         .replace("--force", "force=True"))
        self.assertEqual(str(warned.warning), warning.removeprefix("shardscope: "))


class CommandsTest(unittest.TestCase):
    def test_compare_is_the_clis(self):
        result = shardscope.compare(TINY, "examples/small-fsdp2-8gpu.yaml")
        self.assertEqual(result["text"], cli("simulate", "-q", "--compare", TINY, "examples/small-fsdp2-8gpu.yaml").stdout)
        self.assertEqual(result["reports"][0]["world_size"], 2)
        self.assertEqual(result["reports"][1]["world_size"], 8)

    def test_memory_is_the_clis(self):
        result = shardscope.memory(TINY)
        text = result.pop("text")
        self.assertEqual(result, json.loads(cli("memory", TINY, "--json").stdout))
        self.assertEqual(text, cli("memory", TINY).stdout.split("\n", 1)[1])

    def test_fit_is_the_clis(self):
        result = shardscope.fit(TINY, "micro_batch_size", max_micro_batch=4)
        self.assertEqual(result["text"], cli("fit", TINY, "--search", "micro_batch_size", "--max", "4").stdout)
        self.assertEqual(result["candidates"][result["best"]]["micro_batch_size"], 4)

    def test_check_is_the_clis(self):
        result = shardscope.check(TINY, threads=1)
        completed = cli("check", TINY, "--threads", "1", check=False)
        self.assertEqual(result["text"], completed.stdout)
        self.assertEqual(result["verdict"] == "safe", completed.returncode == 0)
        self.assertEqual(len([c for c in result["cases"] if not c["safe"]]) > 0, result["verdict"] == "hangs")

    def test_bad_check_option_names_it(self):
        with self.assertRaises(shardscope.InputError) as raised:
            shardscope.check(TINY, watchdog_minutes=-1)
        self.assertIn("--watchdog-minutes", str(raised.exception))


class TracesTest(unittest.TestCase):
    REAL = "tests/fixtures/real/traces/hta-resnet-ddp-a100/nccl_data.json.gz"

    def test_analyze_is_the_clis(self):
        result = shardscope.analyze(self.REAL)
        result.pop("text")
        result.pop("warnings")
        self.assertEqual(result, json.loads(cli("analyze", self.REAL, "--json").stdout))

    def test_a_negative_rank_is_refused_as_the_cli_refuses_it(self):
        # None is every rank; a given rank, -1 included, must be one (`--rank -1` exits 2).
        expected = cli_error(["analyze", self.REAL, "--rank", "-1"])
        with self.assertRaises(shardscope.InputError) as raised:
            shardscope.analyze(self.REAL, rank=-1)
        self.assertEqual(str(raised.exception), expected)
        with tempfile.TemporaryDirectory() as work:
            with self.assertRaises(shardscope.InputError) as raised:
                shardscope.diff(self.REAL, self.REAL, work, rank=-1)
            self.assertEqual(str(raised.exception), expected)

    def test_import(self):
        result = shardscope.import_traces(self.REAL)
        self.assertEqual([r["rank"] for r in result["ranks"]], [0])
        slices = result["timeline"][0]["slices"]
        # HTA's test_nccl_parser_config: 21 NCCL kernels in this trace.
        self.assertEqual(sum(1 for n in slices["name"] if n.startswith("ncclKernel") or n.startswith("ncclDevKernel")),
                         21)

    def test_diff_against_a_straggler(self):
        with tempfile.TemporaryDirectory() as work:
            shardscope.simulate(TINY, output=os.path.join(work, "p"))
            shardscope.simulate(TINY, output=os.path.join(work, "m"), stragglers={1: 1.5})
            result = shardscope.diff(os.path.join(work, "p"), os.path.join(work, "m"), os.path.join(work, "d"))
            out = cli("diff", os.path.join(work, "p"), os.path.join(work, "m"), "-o", os.path.join(work, "d2")).stdout
            self.assertEqual(result["headline"].replace(os.path.join(work, "d"), "D"),
                             out.replace(os.path.join(work, "d2"), "D"))
            with open(os.path.join(work, "d2", "report.json"), encoding="utf-8") as f:
                cli_report = json.load(f)
            self.assertEqual(result["report"]["step"], cli_report["step"])
            self.assertEqual(result["report"]["matching"], cli_report["matching"])
            # Every op matched by id; the straggler's kernels are the slower ones.
            errors = result["errors"]
            self.assertEqual(result["report"]["matching"]["by_op_id"], result["report"]["matching"]["matched"])
            self.assertEqual(len(errors["error_ns"]), result["report"]["matching"]["matched"])
            # Rank 1's kernels run 1.5x their time: every one of its compute kernels is slower.
            straggler = [e for r, e, c in zip(errors["rank"], errors["error_ns"], errors["class"])
                         if r == 1 and c in ("gemm", "attention", "memory-bound")]
            self.assertGreater(len(straggler), 0)
            self.assertTrue(all(e > 0 for e in straggler))

    def test_flight_recorder_fixture(self):
        result = shardscope.flight_recorder("tests/fixtures/real/flight-recorder/moe-16-ranks-gpu-error")
        # The NVIDIA dumps: rank 12 missing from nccl:all_to_all #20537 on process group 74
        # (README.md, docs/FLIGHT_RECORDER.md), first of five stuck process groups.
        self.assertEqual(len(result["hangs"]), 5)
        self.assertEqual((result["hangs"][0]["collective"], result["hangs"][0]["seq"]), ("nccl:all_to_all", 20537))
        self.assertTrue(all(h["missing_ranks"] == [12] for h in result["hangs"]))


class HostRunTest(unittest.TestCase):
    def test_run_host_writes_what_the_cli_writes(self):
        with tempfile.TemporaryDirectory() as work:
            run = shardscope.run_host(TINY_DICT, work, steps=1, warmup=1)
            self.assertEqual(run.returncode, 0, run.stderr)
            self.assertTrue(os.path.exists(os.path.join(work, "plan.yaml")))
            self.assertEqual(run.report["world_size"], 2)
            self.assertTrue(run.report["completed"])
            self.assertIsNotNone(run.trace_path)
            if os.geteuid() == 0:
                self.assertIn("--allow-run-as-root", run.command)


if __name__ == "__main__":
    unittest.main()
