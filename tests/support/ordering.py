"""The order the workers take the tests in: the modules that wait on real components first,
the in-process ones last. The suite is CPU-bound on CI's two cores; a run whose last
tests are many short ones ends with every worker busy, where one that ends on a long wait
leaves the cores idle for minutes (`--dist loadgroup` hands out tests in this order).

The tests of a Kubernetes minor still building come after all of them: on a new machine
`make test` builds the older minors beside the suite (NODELEDGER_TEST_KUBE_BUILDING names
them), and their control planes are needed as late as possible."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Heaviest first: a real Slurm cluster, control plane or kubelet; PostgreSQL alone, or a
# test marked slow; the rest.
WEIGHTS = {"deploy": 2, "kube": 2, "slurm": 2, "postgres": 1, "slow": 1}


def weight(item: pytest.Item) -> int:
    return max((w for mark, w in WEIGHTS.items() if item.get_closest_marker(mark)), default=0)


def building(item: pytest.Item) -> bool:
    """A test of a Kubernetes minor whose control plane is still building."""
    minors = os.environ.get("NODELEDGER_TEST_KUBE_BUILDING", "").split()
    params = getattr(getattr(item, "callspec", None), "params", {})
    return params.get("kube_cluster") in minors


@pytest.hookimpl(trylast=True)  # the items left after selection
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A stable sort by each module's heaviest test, the minors still building last: a
    module's tests stay in pytest's order, and the session fixtures' parameters (one Slurm
    release, then the other) stay grouped."""
    modules: dict[Path, int] = {}
    for item in items:
        modules[item.path] = max(modules.get(item.path, 0), weight(item))
    items.sort(key=lambda item: (building(item), -modules[item.path]))
