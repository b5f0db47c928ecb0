"""The benches' one runner: the scenarios of bench/scenarios.toml, run and checked.

    python -m bench                        # list the scenarios
    python -m bench NAME [ARG ...]         # run one: its args, then ARGs (a bench's own,
                                           # see python -m bench NAME --help); prints the
                                           # bench's JSON, then each threshold's verdict
    python -m bench --check NAME FILE      # a saved run's JSON (FILE, or - for stdin)

Exits 1 when an enforced threshold is not met (a target the docs record as missed is
reported as "missed" and does not fail), 2 on a wrong command line.
"""

from __future__ import annotations

import contextlib
import io
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from bench._scenarios import Scenario, Verdict, check, failed, load, printed_figures


def listing(scenarios: dict[str, Scenario]) -> str:
    width = max(map(len, scenarios))
    lines = []
    for s in scenarios.values():
        needs = f" [needs {', '.join(s.needs)}]" if s.needs else ""
        bounds = f" (thresholds: {len(s.thresholds)})" if s.thresholds else ""
        lines.append(f"{s.name:<{width}}  {s.about}{needs}{bounds}")
    return "\n".join(lines)


def verdicts(scenario: Scenario, output: str) -> int:
    """Print each threshold's verdict on stderr; the exit status."""
    found: list[Verdict] = check(scenario, printed_figures(output)) if scenario.thresholds else []
    for v in found:
        print(f"bench {scenario.name}: {v}", file=sys.stderr)
    return 1 if failed(found) else 0


class Tee(io.StringIO):
    """Keeps what is written and passes it on to ``out`` as it comes."""

    def __init__(self, out: TextIO) -> None:
        super().__init__()
        self.out = out

    def write(self, text: str) -> int:
        self.out.write(text)
        return super().write(text)

    def flush(self) -> None:
        self.out.flush()


def run(scenario: Scenario, extra: Sequence[str]) -> int:
    """The bench's figures go to stdout as it prints them, and are kept for the checker."""
    tee = Tee(sys.stdout)
    with contextlib.redirect_stdout(tee):
        scenario.function()([*scenario.args, *extra])
    return verdicts(scenario, tee.getvalue())


def _exit_on_sigterm(signum: int, frame: object) -> None:
    # A bench stopped with kill/timeout unwinds its context managers (services, clusters):
    # a service left running would go on syncing its ledger into the shared test cluster.
    sys.exit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    args = list(sys.argv[1:] if argv is None else argv)
    scenarios = load()
    if not args or args[0] in ("-h", "--help", "list"):
        print(__doc__.strip() if args else "", listing(scenarios), sep="\n\n" if args else "")
        return 0
    if args[0] == "--check":
        if len(args) != 3 or args[1] not in scenarios:
            print(
                f"usage: python -m bench --check NAME FILE\n\n{listing(scenarios)}", file=sys.stderr
            )
            return 2
        text = sys.stdin.read() if args[2] == "-" else Path(args[2]).read_text()
        return verdicts(scenarios[args[1]], text)
    if args[0] not in scenarios:
        print(f"no scenario {args[0]!r}; the scenarios:\n{listing(scenarios)}", file=sys.stderr)
        return 2
    return run(scenarios[args[0]], args[1:])


if __name__ == "__main__":
    sys.exit(main())
