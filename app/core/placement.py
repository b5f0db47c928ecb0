"""kube-scheduler extender decisions over a ledger snapshot. Pure.

Filter: a node passes when it is managed and the admission decision (app.core.decision) on
the pod, the Kubernetes cap included, does not refuse it; every other node gets its
verdict's reason. Unmanaged nodes are out (the extender is for co-located nodes).
Prioritize: prefer nodes where Slurm holds least, then the most free CPU, on
kube-scheduler's 0..10 scale.
"""

from __future__ import annotations

from collections.abc import Mapping

from app.core.caps import KubeCaps
from app.core.decision import HELD_NOW, decide_each
from app.core.records import NodeView
from app.core.resources import Resources

MAX_SCORE = 10


def filter_nodes(
    requests: Resources,
    candidates: list[str],
    views: Mapping[str, NodeView],
    caps: KubeCaps | None = None,
) -> tuple[list[str], dict[str, str]]:
    """(nodes that fit, {node: why not})"""
    fits: list[str] = []
    failed: dict[str, str] = {}
    known: list[str] = []
    managed: list[NodeView] = []
    for name in candidates:
        if (view := views.get(name)) is None:
            failed[name] = f"node {name} is not managed by nodeledger"
        else:
            known.append(name)
            managed.append(view)
    for name, decided in zip(known, decide_each(managed, requests, caps), strict=True):
        if decided is HELD_NOW:  # the one value of an ungated decision that holds
            fits.append(name)
        else:
            failed[name] = decided.verdict.reason
    return fits, failed


def prioritize(candidates: list[str], views: Mapping[str, NodeView]) -> list[tuple[str, int]]:
    scores = []
    for name in candidates:
        view = views.get(name)
        cpu = 0 if view is None else view.allocatable.cpu_millis
        if view is None or cpu <= 0:
            scores.append((name, 0))
            continue
        slurm_idle = 1 - min(1.0, view.held_by_slurm.cpu_millis / cpu)
        free = max(0.0, min(1.0, view.free.cpu_millis / cpu))
        scores.append((name, round(MAX_SCORE * (0.6 * slurm_idle + 0.4 * free))))
    return scores
