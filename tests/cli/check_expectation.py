#!/usr/bin/env python3
"""Checks a simulate report.json against the plan's `expect:` section (docs/PLAN.md).

usage: check_expectation.py PLAN.yaml REPORT.json
Exit 0 when the report shows what the plan expects, 1 (with the reason) when it does not,
2 when the plan has no expect section. Each outcome is checked from both sides, so a plan
that expects an out-of-memory fails when no rank runs out of memory.
"""
import json
import sys

import yaml


def fail(message):
    print(message)
    sys.exit(1)


def main():
    plan_path, report_path = sys.argv[1], sys.argv[2]
    with open(plan_path) as f:
        plan = yaml.safe_load(f)
    expect = plan.get("expect") if isinstance(plan, dict) else None
    if not isinstance(expect, dict) or "outcome" not in expect:
        print(f"{plan_path}: no expect: {{outcome: ...}} section")
        sys.exit(2)
    with open(report_path) as f:
        report = json.load(f)
    outcome = expect["outcome"]
    oom_ranks = sorted(r["rank"] for r in report["ranks"] if r.get("oom") is not None)
    causes = sorted({c["kind"] for c in (report.get("hang_report") or {}).get("causes", [])})
    agreed = report.get("oom_agreed")
    seen = (f"completed={report['completed']} hang={report['hang']} oom_ranks={oom_ranks} causes={causes} "
            f"oom_agreed={'yes' if agreed else 'no'}")

    if outcome == "completes":
        if not report["completed"] or report["hang"] or oom_ranks or agreed:
            fail(f"expected the step to complete on every rank, got {seen}")
    elif outcome == "hangs":
        if not report["hang"] or report["completed"]:
            fail(f"expected a hang, got {seen}")
        cause = expect.get("cause")
        if cause is not None and cause not in causes:
            fail(f"expected a hang caused by {cause}, got {seen}")
    elif outcome == "oom_agreed":
        if report["hang"] or not agreed:
            fail(f"expected the ranks to agree on an out-of-memory without a hang, got {seen}")
        oom_ranks = sorted(agreed["oom_ranks"])
    elif outcome == "out_of_memory":
        if not oom_ranks:
            fail(f"expected some rank to run out of memory, got {seen}")
        if report["completed"]:
            fail(f"expected the step not to complete, got {seen}")
        if any(c != "out_of_memory" for c in causes):
            fail(f"expected out-of-memory to be the only cause, got {seen}")
    else:
        fail(f"unknown expected outcome {outcome!r}")

    expected_ranks = expect.get("oom_ranks")
    if expected_ranks is not None and sorted(expected_ranks) != oom_ranks:
        fail(f"expected ranks {sorted(expected_ranks)} to run out of memory, got {seen}")


if __name__ == "__main__":
    main()
