"""Executes notebooks/*.ipynb top to bottom and checks what they showed against the CLI.

    /usr/bin/python3 tests/notebooks/run_notebooks.py --build build [--keep DIR] [NAME...]

Each notebook runs with `jupyter nbconvert --to notebook --execute` on Debian's python3 kernel
(ipykernel), the module from BUILD/python, and $SHARDSCOPE_NOTEBOOK_OUT pointing into a
temporary folder. A notebook passes when
- no cell raised (nbconvert fails, and no output of type "error" is left),
- it drew figures, each with an axis label, and every axis label states a unit "(...)",
- every number it recorded in shown.json equals the CLI's output for the same input: report.json
  of `shardscope simulate` on the plan file it names, the host run's own report.json, the
  report.json of `shardscope diff` with the same arguments, `shardscope analyze --json`.
Prints each notebook's wall time. Exit 0 when all pass (ctest: notebooks, label "notebooks").

--stripped only checks that the committed notebooks hold no outputs (ctest: notebooks_stripped).
"""

import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
UNIT = re.compile(r"\(.+\)")


def at(d, key):
    for part in key.split("."):
        d = d[int(part)] if isinstance(d, list) else d[part]
    return d


class Checker:
    def __init__(self, binary, work):
        self.binary = binary
        self.work = work
        self.failures = []
        self.count = 0

    def fail(self, what):
        self.failures.append(what)
        print("FAIL", what)

    def equal(self, what, got, want):
        self.count += 1
        if got != want:
            self.fail(f"{what}: the notebook showed {got!r}, the CLI gives {want!r}")

    def cli(self, *args):
        return subprocess.run([self.binary, *args], capture_output=True, text=True, check=False)

    def simulate_report(self, path):
        out = tempfile.mkdtemp(dir=self.work)
        completed = self.cli("simulate", path, "-q", "-o", out)
        if completed.returncode != 0:
            self.fail(f"shardscope simulate {path}: exit {completed.returncode}: {completed.stderr}")
            return None
        with open(os.path.join(out, "report.json"), encoding="utf-8") as f:
            return json.load(f)

    def check_shown(self, name, shown):
        for plan, entry in shown.get("plans", {}).items():
            report = self.simulate_report(entry["path"])
            if report is None:
                continue
            for key, value in entry["figures"].items():
                self.equal(f"{name}: plan {plan}: {key}", value, at(report, key))
        for run, entry in shown.get("runs", {}).items():
            if isinstance(entry, dict) and "path" in entry and entry["path"].endswith("report.json"):
                with open(entry["path"], encoding="utf-8") as f:
                    report = json.load(f)
                for key, value in entry["figures"].items():
                    self.equal(f"{name}: run {run}: {key}", value, at(report, key))
            elif isinstance(entry, dict) and "ranks" in entry:
                completed = self.cli("analyze", entry["path"], "--json")
                self.equal(f"{name}: {run}: analyze", entry["ranks"], json.loads(completed.stdout)["ranks"])
        for diff, entry in shown.get("diffs", {}).items():
            out = tempfile.mkdtemp(dir=self.work)
            args = ["diff", entry["predicted"], entry["measured"], "-o", out, "--top", str(entry["top"])]
            if "options_step" in entry:
                args += ["--step", str(entry["options_step"])]
            completed = self.cli(*args)
            if completed.returncode != 0:
                self.fail(f"{name}: shardscope {' '.join(args)}: exit {completed.returncode}: {completed.stderr}")
                continue
            with open(os.path.join(out, "report.json"), encoding="utf-8") as f:
                report = json.load(f)
            for key in ("step", "matching"):
                self.equal(f"{name}: diff {diff}: {key}", entry[key], report[key])
            for side in ("predicted", "measured"):
                key = f"critical_path_{side}_ns"
                if key in entry:
                    self.equal(f"{name}: diff {diff}: {key}", entry[key], report["step"][key])

    def check_figures(self, name, shown, executed):
        images = sum(1 for cell in executed["cells"] for output in cell.get("outputs", [])
                     if "image/png" in output.get("data", {}))
        if images == 0 or not shown.get("figures"):
            self.fail(f"{name}: no figure drawn")
        self.count += 1
        for figure in shown.get("figures", []):
            title = "; ".join(t for t in figure["titles"] if t)
            if not any(figure["labels"]):
                self.fail(f"{name}: figure '{title}' has no axis label")
            for label in figure["labels"]:
                if label and not UNIT.search(label):
                    self.fail(f"{name}: figure '{title}': axis '{label}' states no unit")


def stripped():
    """The committed notebooks' code cells hold no outputs and no execution counts."""
    passed = failed = 0
    for path in sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb"))):
        with open(path, encoding="utf-8") as f:
            nb = json.load(f)
        dirty = [i for i, cell in enumerate(nb["cells"]) if cell["cell_type"] == "code" and
                 (cell.get("outputs") or cell.get("execution_count") is not None)]
        if dirty:
            print(f"FAIL {os.path.relpath(path, ROOT)}: cells {dirty} hold outputs (clear them before committing)")
            failed += 1
        else:
            print(f"{os.path.relpath(path, ROOT)}: {len(nb['cells'])} cells, no outputs")
            passed += 1
    return passed, failed


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", default="build")
    parser.add_argument("--keep", help="execute into this folder and keep it")
    parser.add_argument("--stripped", action="store_true")
    parser.add_argument("names", nargs="*")
    args = parser.parse_args()
    if args.stripped:
        passed, failed = stripped()
        print(f"{passed} passed, {failed} failed")
        return 1 if failed or not passed else 0
    build = os.path.abspath(args.build)
    binary = os.path.join(build, "bin", "shardscope")
    work = args.keep or tempfile.mkdtemp(prefix="shardscope-notebooks-")
    os.makedirs(work, exist_ok=True)
    checker = Checker(binary, work)
    env = dict(os.environ, PYTHONPATH=os.path.join(build, "python"), SHARDSCOPE_BINARY=binary, MPLBACKEND="Agg")
    notebooks = sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb")))
    if args.names:
        notebooks = [n for n in notebooks if any(name in os.path.basename(n) for name in args.names)]
    passed = failed = 0
    total = 0.0
    for path in notebooks:
        name = os.path.splitext(os.path.basename(path))[0]
        out = os.path.join(work, name)
        os.makedirs(out, exist_ok=True)
        before = len(checker.failures)
        start = time.monotonic()
        completed = subprocess.run(
            [sys.executable, "-m", "nbconvert", "--to", "notebook", "--execute", "--output-dir", out,
             "--ExecutePreprocessor.timeout=600", "--ExecutePreprocessor.kernel_name=python3", path],
            env=dict(env, SHARDSCOPE_NOTEBOOK_OUT=out), capture_output=True, text=True, check=False)
        seconds = time.monotonic() - start
        total += seconds
        print(f"{name}: executed in {seconds:.1f} s (exit {completed.returncode})")
        if completed.returncode != 0:
            checker.fail(f"{name}: nbconvert --execute failed:\n{completed.stderr[-4000:]}")
        else:
            with open(os.path.join(out, os.path.basename(path)), encoding="utf-8") as f:
                executed = json.load(f)
            errors = [o for c in executed["cells"] for o in c.get("outputs", []) if o.get("output_type") == "error"]
            if errors:
                checker.fail(f"{name}: a cell raised {errors[0].get('ename')}: {errors[0].get('evalue')}")
            with open(os.path.join(out, "shown.json"), encoding="utf-8") as f:
                shown = json.load(f)
            checker.check_shown(name, shown)
            checker.check_figures(name, shown, executed)
        if len(checker.failures) == before:
            passed += 1
        else:
            failed += 1
    print(f"notebooks: {total:.1f} s in all; {checker.count} figures and numbers compared with the CLI")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
