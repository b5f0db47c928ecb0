"""The scenarios of bench/scenarios.toml, and the checker that holds a run's figures
against their thresholds (as kueue's performance checker holds a run against its
rangespec): the bounds are data with their provenance, not code in each bench."""

from __future__ import annotations

import importlib
import json
import tomllib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCENARIOS = Path(__file__).with_name("scenarios.toml")
NEEDS = frozenset({"kubernetes", "postgresql", "root", "slurm", "slurm >= 25.05"})

Entry = Callable[[Sequence[str] | None], None]


@dataclass(frozen=True)
class Threshold:
    figure: tuple[str, ...]
    source: str
    max: float | None = None
    min: float | None = None
    enforced: bool = True
    name: str | None = None

    @property
    def limit(self) -> float:
        """The bound's number, max or min."""
        found = self.max if self.max is not None else self.min
        assert found is not None
        return found

    @property
    def bound(self) -> str:
        return f"<= {self.max:g}" if self.max is not None else f">= {self.min:g}"

    def holds(self, value: float) -> bool:
        if self.max is not None:
            return value <= self.max
        assert self.min is not None
        return value >= self.min


@dataclass(frozen=True)
class Scenario:
    name: str
    entry: str
    about: str
    args: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()
    thresholds: tuple[Threshold, ...] = field(default=())

    def function(self) -> Entry:
        """The entry point, imported: ``module:function``."""
        module, _, name = self.entry.partition(":")
        found: Entry = getattr(importlib.import_module(module), name)
        return found


@dataclass(frozen=True)
class Verdict:
    threshold: Threshold
    figure: str  # the path of the figure, "*" replaced by the key it stood for
    measured: float | None  # None: the run has no such figure

    @property
    def ok(self) -> bool:
        return self.measured is not None and self.threshold.holds(self.measured)

    def __str__(self) -> str:
        state = "ok" if self.ok else "FAILED" if self.threshold.enforced else "missed"
        measured = "absent" if self.measured is None else f"{self.measured:g}"
        return (
            f"{state}: {self.figure} = {measured}, {self.threshold.bound} ({self.threshold.source})"
        )


def _threshold(raw: dict[str, Any], where: str) -> Threshold:
    unknown = set(raw) - {"figure", "source", "max", "min", "enforced", "name"}
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
    figure = raw.get("figure")
    if not isinstance(figure, list) or not figure or not all(isinstance(k, str) for k in figure):
        raise ValueError(f"{where}: figure must be a non-empty list of keys")
    if ("max" in raw) == ("min" in raw):
        raise ValueError(f"{where}: exactly one of max and min")
    bound = raw.get("max", raw.get("min"))
    if isinstance(bound, bool) or not isinstance(bound, int | float):
        raise ValueError(f"{where}: the bound must be a number")
    if not isinstance(raw.get("source"), str) or not raw["source"].strip():
        raise ValueError(f"{where}: a threshold says where it comes from (source)")
    return Threshold(
        figure=tuple(figure),
        source=raw["source"],
        max=float(raw["max"]) if "max" in raw else None,
        min=float(raw["min"]) if "min" in raw else None,
        enforced=bool(raw.get("enforced", True)),
        name=raw.get("name"),
    )


def _scenario(name: str, raw: dict[str, Any]) -> Scenario:
    unknown = set(raw) - {"entry", "about", "args", "needs", "thresholds"}
    if unknown:
        raise ValueError(f"{name}: unknown keys {sorted(unknown)}")
    entry, about = raw.get("entry"), raw.get("about")
    if not isinstance(entry, str) or entry.count(":") != 1:
        raise ValueError(f"{name}: entry must be 'module:function'")
    if not isinstance(about, str) or not about:
        raise ValueError(f"{name}: about says what the scenario measures")
    args, needs = raw.get("args", []), raw.get("needs", [])
    if not all(isinstance(a, str) for a in args):
        raise ValueError(f"{name}: args must be strings")
    if not set(needs) <= NEEDS:
        raise ValueError(f"{name}: needs {sorted(set(needs) - NEEDS)}, not one of {sorted(NEEDS)}")
    return Scenario(
        name=name,
        entry=entry,
        about=about,
        args=tuple(args),
        needs=tuple(needs),
        thresholds=tuple(
            _threshold(t, f"{name}.thresholds[{i}]")
            for i, t in enumerate(raw.get("thresholds", []))
        ),
    )


def load(path: Path = SCENARIOS) -> dict[str, Scenario]:
    """Every scenario of the file by name; ValueError naming what is wrong with it."""
    with path.open("rb") as f:
        data = tomllib.load(f)
    return {name: _scenario(name, raw) for name, raw in data.items()}


def threshold(scenario: str, name: str) -> Threshold:
    """The threshold called ``name`` of a scenario (for a bench that prints its targets)."""
    return next(t for t in load()[scenario].thresholds if t.name == name)


def _values(figures: Any, path: tuple[str, ...], seen: str) -> Iterator[tuple[str, Any]]:
    if not path:
        yield seen, figures
        return
    key, rest = path[0], path[1:]
    keys = list(figures) if key == "*" and isinstance(figures, dict) else [key]
    if key == "*" and not keys:
        yield f"{seen}.*", None  # nothing to hold the bound: absent
    for k in keys:
        inner = figures.get(k) if isinstance(figures, dict) else None
        yield from _values(inner, rest, f"{seen}.{k}" if seen else k)


def check(scenario: Scenario, figures: dict[str, Any]) -> list[Verdict]:
    """One verdict per figure a threshold names (a "*" names several)."""
    verdicts = []
    for t in scenario.thresholds:
        for where, value in _values(figures, t.figure, ""):
            measured = (
                float(value)
                if isinstance(value, int | float) and not isinstance(value, bool)
                else None
            )
            verdicts.append(Verdict(t, where, measured))
    return verdicts


def failed(verdicts: list[Verdict]) -> list[Verdict]:
    """The verdicts that fail a run: enforced thresholds not held."""
    return [v for v in verdicts if not v.ok and v.threshold.enforced]


def printed_figures(text: str) -> dict[str, Any]:
    """The JSON object a bench printed last (indented: it starts at a line "{"); whatever
    it printed before is skipped."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line == "{"]
    if not starts:
        raise ValueError("no JSON object in the bench's output")
    figures = json.loads("\n".join(lines[starts[-1] :]))
    if not isinstance(figures, dict):
        raise ValueError("the bench's output is not a JSON object")
    return figures
