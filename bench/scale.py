"""Every scale figure of issue 9 in one JSON document: runs the three scale benches, each on
components of its own, one after the other (they share the machine's two cores), and
gathers what they print.

- ``bench.ledger_scale``: the ledger at each size (extender filter in-process and over
  HTTP, admission and release, single-node reads, RSS);
- ``bench.kube_scale``: a real kube-apiserver holding N Nodes x 10 bound pods (startup,
  restart, idle CPU, RSS, full resync, churn, GenericNode writes per second);
- ``bench.slurm_scale``: a real slurmctld + slurmrestd defining N nodes and holding
  4/3 N jobs (20,000 at 15,000 nodes): admission next to a raw node update, staleness,
  cluster-wide read costs.

    python -m bench.scale [--sizes 100,1000,15000] [--only ledger,kube,slurm]

Not run in CI: 15,000 nodes take about an hour on two cores.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

BENCHES = ("ledger", "kube", "slurm")


def run(module: str, *args: str) -> Any:
    """The JSON object the bench printed last (indented: it starts with a line "{")."""
    out = subprocess.run(
        [sys.executable, "-m", module, *args], check=True, stdout=subprocess.PIPE, text=True
    ).stdout
    lines = out.splitlines()
    start = max(i for i, line in enumerate(lines) if line == "{")
    return json.loads("\n".join(lines[start:]))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,1000,15000")
    parser.add_argument("--only", default=",".join(BENCHES))
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    only = set(args.only.split(","))
    figures: dict[str, Any] = {"sizes": sizes}
    if "ledger" in only:
        figures["ledger"] = run("bench.ledger_scale", "--sizes", args.sizes)
    if "kube" in only:
        figures["kube"] = run("bench.kube_scale", "--nodes", args.sizes)
    if "slurm" in only:
        figures["slurm"] = {
            str(n): run("bench.slurm_scale", "--nodes", str(n), "--jobs", str(n * 4 // 3))
            for n in sizes
        }
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
