"""The benches' one statistics vocabulary, so that a "p99" or a "summary" means the same
in every figure they print.

- ``percentile(samples, p)``: p in [0, 100], the nearest rank at or above ``p``% of the
  sorted samples (index ``int(p / 100 * n)``, the largest for p = 100);
- ``summary(samples)``: ``{"p50", "p99", "n"}`` (p50 the median), ``{"n": 0}`` when empty;
  ``spread=True`` adds ``min`` and ``max``; the unit is the enclosing key's (``..._ms``);
- ``against(samples, raw)``: a summary with its p50 and p99 as ratios to a reference's
  (the raw Slurm node update measured in the same run);
- ``timed(call)``: one call's milliseconds; ``repeated`` calls it within a time budget;
  ``interleaved`` samples several paths round by round, so that a slow moment of the shared
  machine falls on all of them alike.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def summary(samples: list[float], *, digits: int = 2, spread: bool = False) -> dict[str, float]:
    if not samples:
        return {"n": 0}
    figures: dict[str, float] = {}
    if spread:
        figures["min"] = round(min(samples), digits)
    figures["p50"] = round(statistics.median(samples), digits)
    figures["p99"] = round(percentile(samples, 99), digits)
    if spread:
        figures["max"] = round(max(samples), digits)
    figures["n"] = len(samples)
    return figures


def against(samples: list[float], raw: list[float]) -> dict[str, float]:
    """``summary(samples)`` with ``to_raw_update_p50`` and ``_p99``: its percentiles over
    the raw update's (empty samples: ``{"n": 0}``)."""
    if not samples:
        return {"n": 0}
    return {
        **summary(samples),
        "to_raw_update_p50": round(statistics.median(samples) / statistics.median(raw), 2),
        "to_raw_update_p99": round(percentile(samples, 99) / percentile(raw, 99), 2),
    }


def timed(call: Callable[..., Any]) -> float:
    """Milliseconds one call took (``...``: a lambda binding a loop's variable by a
    default argument is called with none)."""
    t0 = time.perf_counter()
    call()
    return (time.perf_counter() - t0) * 1000


def repeated(call: Callable[[], Any], samples: int, budget: float) -> list[float]:
    """Milliseconds per call: ``samples`` calls, fewer (at least 5) past ``budget`` seconds."""
    times: list[float] = []
    deadline = time.monotonic() + budget
    while len(times) < samples and (len(times) < 5 or time.monotonic() < deadline):
        times.append(timed(call))
    return times


def interleaved(
    rounds: int, per_round: int, paths: dict[str, Callable[[int], dict[str, list[float]]]]
) -> dict[str, dict[str, list[float]]]:
    """Each path ``per_round`` samples a round, in an order rotating by one each round."""
    names = list(paths)
    samples: dict[str, dict[str, list[float]]] = {name: {} for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            for key, values in paths[name](per_round).items():
                samples[name].setdefault(key, []).extend(values)
    return samples
