"""The order the workers take the tests in: the modules that wait on real components first,
the in-process ones last. The suite is CPU-bound on CI's two cores; a run whose last
tests are many short ones ends with every worker busy, where one that ends on a long wait
leaves the cores idle for minutes (`--dist loadgroup` hands out tests in this order)."""

from __future__ import annotations

from pathlib import Path

import pytest

# Heaviest first: a real Slurm cluster, control plane or kubelet; PostgreSQL alone, or a
# test marked slow; the rest.
WEIGHTS = {"deploy": 2, "kube": 2, "slurm": 2, "postgres": 1, "slow": 1}


def weight(item: pytest.Item) -> int:
    return max((w for mark, w in WEIGHTS.items() if item.get_closest_marker(mark)), default=0)


@pytest.hookimpl(trylast=True)  # the items left after selection
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A stable sort by each module's heaviest test: a module's tests stay in pytest's order,
    and the session fixtures' parameters (one Slurm release, then the other) stay grouped."""
    modules: dict[Path, int] = {}
    for item in items:
        modules[item.path] = max(modules.get(item.path, 0), weight(item))
    items.sort(key=lambda item: -modules[item.path])
