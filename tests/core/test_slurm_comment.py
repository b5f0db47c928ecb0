"""The node comment that names who holds what Slurm withholds (app.core.slurm_comment)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from app.core.counts import withheld
from app.core.records import (
    HolderKind,
    Holding,
    NodeHeadroom,
    NodeSpec,
    NodeView,
)
from app.core.resources import Resources
from app.core.slurm_comment import node_comment, ours
from tests.support import builders

GIB = 1024**3
NOW = datetime(2026, 11, 27, tzinfo=UTC)


def holding(kind: HolderKind, name: str, cpu_millis: int, gpus: int = 0) -> Holding:
    resources = Resources(cpu_millis, GIB, gpus)
    return builders.holding(kind, f"uid-{name}", resources, name=name, at=NOW)


def view(
    *holdings: Holding, target: Resources = Resources.ZERO, health: str | None = None
) -> NodeView:
    spec = NodeSpec(capacity=Resources(16_000, 64 * GIB, 4))
    headroom = NodeHeadroom(target=target)
    return builders.node_view(spec, *holdings, health=health, at=NOW, headroom=headroom)


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        (view(), ""),
        (
            view(holding(HolderKind.POD, "ml/train-0", 2500, 1)),
            "nodeledger: k8s withholds cpu=3 mem=1024M gpu=1: pods ml/train-0",
        ),
        (
            view(*(holding(HolderKind.POD, f"default/p{i}", 1000) for i in range(7))),
            "nodeledger: k8s withholds cpu=7 mem=7168M:"
            " pods default/p0 default/p1 default/p2 default/p3 default/p4 +2 more",
        ),
        (
            view(holding(HolderKind.MANUAL, "maintenance", 4000)),
            "nodeledger: k8s withholds cpu=4 mem=1024M: reservations maintenance",
        ),
        (
            view(target=Resources(2000, 4 * GIB, 0)),
            "nodeledger: k8s withholds cpu=2 mem=4096M: headroom cpu=2 mem=4096M",
        ),
        (
            view(holding(HolderKind.SLURM_JOB, "42", 4000)),  # a job's own: nothing withheld
            "",
        ),
    ],
)
def test_the_comment_names_each_kind_of_holder(node: NodeView, expected: str) -> None:
    assert node_comment(node, withheld(node)) == expected


@pytest.mark.parametrize(
    ("comment", "free"),
    [("", True), ("nodeledger: k8s withholds cpu=1 mem=1M", True), ("rack 7", False)],
)
def test_only_an_empty_comment_or_the_services_own_is_written(comment: str, free: bool) -> None:
    assert ours(comment) is free
