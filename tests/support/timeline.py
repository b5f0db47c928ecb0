"""Where a run's time and CPU go, test by test: with NODELEDGER_TEST_TIMELINE=DIR each
worker appends one JSON line per test to DIR/<worker>.jsonl (its start, wall seconds
from setup to teardown, and the CPU seconds of the worker and of the processes it waited
for: kubectl, scontrol, the services under test) and its outcome. The cluster daemons'
CPU is not in it.

    python -m tests.support.timeline DIR    # the heaviest tests, by directory, the tail
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ENV = "NODELEDGER_TEST_TIMELINE"


_OUTCOMES: dict[str, str] = {}  # nodeid -> the first of its phases' outcomes not "passed"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if os.environ.get(ENV) and _OUTCOMES.get(report.nodeid, "passed") == "passed":
        _OUTCOMES[report.nodeid] = report.outcome


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    directory = os.environ.get(ENV)
    if not directory:
        yield
        return
    start, wall = time.time(), time.monotonic()
    own, children = _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN)
    yield
    line = {
        "test": item.nodeid,
        "worker": os.environ.get("PYTEST_XDIST_WORKER", "gw0"),
        "start": round(start, 3),
        "wall": round(time.monotonic() - wall, 3),
        "cpu": round(_cpu(resource.RUSAGE_SELF) - own, 3),
        "children": round(_cpu(resource.RUSAGE_CHILDREN) - children, 3),
        "outcome": _OUTCOMES.pop(item.nodeid, "passed"),
    }
    out = Path(directory) / f"{line['worker']}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as f:
        f.write(json.dumps(line) + "\n")


def summary(directory: Path, top: int = 30) -> dict[str, Any]:
    rows = [json.loads(x) for f in directory.glob("*.jsonl") for x in f.read_text().splitlines()]
    if not rows:
        return {"tests": 0}
    first = min(r["start"] for r in rows)
    by_dir: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for r in rows:
        totals = by_dir[r["test"].split("::")[0].rsplit("/", 1)[0]]
        for i, key in enumerate(("wall", "cpu", "children")):
            totals[i] += r[key]
    heaviest = sorted(rows, key=lambda r: -(r["cpu"] + r["children"]))[:top]
    ends = sorted(rows, key=lambda r: -(r["start"] + r["wall"]))[:10]
    failed = [r["test"] for r in rows if r.get("outcome") == "failed"]
    return {
        "tests": len(rows),
        "span_s": round(max(r["start"] + r["wall"] for r in rows) - first),
        "cpu_s": round(sum(r["cpu"] for r in rows)),
        "children_cpu_s": round(sum(r["children"] for r in rows)),
        "failed": failed,
        "by_directory": {
            d: {"wall_s": round(w), "cpu_s": round(c), "children_cpu_s": round(ch)}
            for d, (w, c, ch) in sorted(by_dir.items(), key=lambda kv: -(kv[1][1] + kv[1][2]))
        },
        "heaviest": [{k: r[k] for k in ("test", "wall", "cpu", "children")} for r in heaviest],
        "last_to_end": [
            {
                "test": r["test"],
                "worker": r["worker"],
                "ends_at_s": round(r["start"] + r["wall"] - first),
            }
            for r in ends
        ],
    }


if __name__ == "__main__":
    print(json.dumps(summary(Path(sys.argv[1])), indent=1))
