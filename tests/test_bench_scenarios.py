"""bench/scenarios.toml is valid, each scenario resolves to a bench that takes its
arguments, and the checker accepts and rejects runs by the thresholds (kueue's
performance checker_test.go, for our benches). Nothing here runs a bench."""

from __future__ import annotations

import inspect
import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from bench import __main__ as runner
from bench._scenarios import (
    SCENARIOS,
    Scenario,
    Threshold,
    check,
    failed,
    load,
    printed_figures,
    threshold,
)

ALL = load()


def scenario(toml: str, tmp_path: Path) -> dict[str, Scenario]:
    path = tmp_path / "scenarios.toml"
    path.write_text(toml)
    return load(path)


def test_the_file_parses_and_every_threshold_says_where_it_comes_from() -> None:
    raw = tomllib.loads(SCENARIOS.read_text())
    assert set(raw) == set(ALL)
    for s in ALL.values():
        for t in s.thresholds:
            assert "docs/benchmarks.md#" in t.source or "issue" in t.source, (s.name, t)


@pytest.mark.parametrize("name", sorted(ALL))
def test_every_scenario_resolves_to_an_entry_point_taking_its_arguments(name: str) -> None:
    entry = ALL[name].function()
    assert callable(entry)
    assert list(inspect.signature(entry).parameters) == ["argv"]
    # The scenario's own arguments are the bench's: --help after them exits cleanly
    # before anything is started.
    with pytest.raises(SystemExit) as exited:
        entry([*ALL[name].args, "--help"])
    assert exited.value.code == 0


def test_every_bench_module_is_a_scenario() -> None:
    modules = {p.stem for p in Path(SCENARIOS).parent.glob("*.py") if not p.stem.startswith("_")}
    assert modules == {s.entry.split(":")[0].removeprefix("bench.") for s in ALL.values()}


def test_the_headroom_prints_the_bounds_of_the_data() -> None:
    assert threshold("headroom", "on_single_within_headroom_p50").bound == "<= 1"
    assert threshold("headroom", "on_burst_overall_p50").bound == "<= 2"


HEAD = '[a]\nentry = "m:f"\nabout = "x"\n'
BOUND = HEAD + "[[a.thresholds]]\n"


@pytest.mark.parametrize(
    ("toml", "error"),
    [
        pytest.param('[a]\nabout = "x"\n', "entry", id="no-entry"),
        pytest.param('[a]\nentry = "bench.x"\nabout = "x"\n', "entry", id="no-function"),
        pytest.param('[a]\nentry = "m:f"\n', "about", id="no-about"),
        pytest.param(HEAD + 'needs = ["gpu"]\n', "needs", id="unknown-need"),
        pytest.param(HEAD + "repeat = 3\n", "unknown", id="unknown-key"),
        pytest.param(BOUND + 'figure = ["p"]\nsource = "s"\n', "max and min", id="no-bound"),
        pytest.param(
            BOUND + 'figure = ["p"]\nmax = 1\nmin = 0\nsource = "s"\n', "max and min", id="two"
        ),
        pytest.param(BOUND + 'figure = ["p"]\nmax = 1\n', "source", id="no-source"),
        pytest.param(BOUND + 'figure = "p"\nmax = 1\nsource = "s"\n', "figure", id="not-a-path"),
        pytest.param(BOUND + 'figure = ["p"]\nmax = "1"\nsource = "s"\n', "number", id="text"),
    ],
)
def test_an_invalid_file_is_refused(toml: str, error: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=error):
        scenario(toml, tmp_path)


BOUNDS = """
[b]
entry = "bench.http_admissions:main"
about = "sample"
[[b.thresholds]]
figure = ["cases", "sqlite/1", "admissions_per_s"]
min = 500
source = "s"
[[b.thresholds]]
figure = ["burst", "*", "ratio"]
max = 2
source = "s"
[[b.thresholds]]
figure = ["slow"]
max = 3
enforced = false
source = "missed, on record"
"""


def run(rate: Any, bursts: dict[str, Any], slow: float = 1) -> dict[str, Any]:
    """A run's figures: ``rate`` the admissions/s (absent: None), ``bursts`` each kind's
    ratio."""
    cases = {} if rate is None else {"sqlite/1": {"admissions_per_s": rate}}
    return {"cases": cases, "burst": {k: {"ratio": v} for k, v in bursts.items()}, "slow": slow}


RATE = "cases.sqlite/1.admissions_per_s"


@pytest.mark.parametrize(
    ("figures", "failing"),
    [
        pytest.param(run(895, {"cold": 1.7, "warm": 0.6}), [], id="met"),
        pytest.param(run(500, {"cold": 2}), [], id="at-the-bounds"),
        pytest.param(run(428, {"cold": 1}), [RATE], id="below-min"),
        pytest.param(run(900, {"cold": 2.1, "warm": 1}), ["burst.cold.ratio"], id="one-above-max"),
        pytest.param(run(None, {"cold": 1}), [RATE], id="absent"),
        pytest.param(run(900, {}), ["burst.*"], id="nothing-under-star"),
        pytest.param(run("900", {"warm": True}), [RATE, "burst.warm.ratio"], id="not-numbers"),
        pytest.param(run(900, {"warm": 1}, slow=7.35), [], id="missed-not-enforced"),
    ],
)
def test_the_checker_accepts_and_rejects_runs(
    figures: dict[str, Any], failing: list[str], tmp_path: Path
) -> None:
    verdicts = check(scenario(BOUNDS, tmp_path)["b"], figures)
    assert [v.figure for v in failed(verdicts)] == failing


def test_a_missed_target_is_reported_not_failed(tmp_path: Path) -> None:
    verdicts = check(scenario(BOUNDS, tmp_path)["b"], run(None, {}, slow=7.35))
    slow = next(v for v in verdicts if v.figure == "slow")
    assert not slow.ok
    assert slow not in failed(verdicts)
    assert str(slow).startswith("missed: slow = 7.35, <= 3")


def test_the_figures_are_the_last_json_object_printed() -> None:
    first, last = {"a": 1}, {"b": {"c": [1, 2]}}
    text = f"starting\n{json.dumps(first, indent=2)}\nmore\n{json.dumps(last, indent=2)}\n"
    assert printed_figures(text) == last
    with pytest.raises(ValueError, match="no JSON object"):
        printed_figures("no figures\n")


def test_the_runner_checks_a_saved_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    saved = tmp_path / "run.json"
    bounds = {"cases": {"sqlite/1": {"admissions_per_s": 895, "admit_p99_ms": 10.7}}}
    saved.write_text(json.dumps(bounds, indent=2))
    assert runner.main(["--check", "http_admissions", str(saved)]) == 0
    bounds["cases"]["sqlite/1"]["admit_p99_ms"] = 40.1
    saved.write_text(json.dumps(bounds, indent=2))
    assert runner.main(["--check", "http_admissions", str(saved)]) == 1
    assert "FAILED: cases.sqlite/1.admit_p99_ms = 40.1, <= 20" in capsys.readouterr().err


def test_the_runner_lists_and_refuses_unknown_scenarios(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert runner.main([]) == 0
    assert "headroom" in capsys.readouterr().out
    assert runner.main(["no_such_bench"]) == 2
    assert "no scenario 'no_such_bench'" in capsys.readouterr().err


def test_a_threshold_bound_reads_as_written() -> None:
    assert Threshold(("x",), "s", max=1.5).bound == "<= 1.5"
    assert Threshold(("x",), "s", min=500).bound == ">= 500"
