"""Node registration: every node Slurm lists that the ledger lacks becomes a ledger node.

Sized by Slurm (CPUs, usable memory, GPUs) and not admissible from the start when Slurm
says it is unusable (DOWN, DRAIN, ...), so no admission can land on it before the first
reconcile. Nodes the ledger has are left alone (the reconcile keeps them current).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from app.core.counts import node_size
from app.core.plan import health_reason
from app.core.records import NodeSpec, NodeView
from app.core.slurm_models import SlurmNode
from app.ledger.service import Ledger
from app.ledger.snapshot import NodeViews


def register_unknown(
    ledger: Ledger,
    node_views: NodeViews,
    views: Sequence[NodeView],
    slurm_nodes: Collection[SlurmNode],
) -> Sequence[NodeView]:
    """Create the ledger nodes ``views`` lack; every node view, read again if any was."""
    known = {v.slurm_name for v in views}
    for node in slurm_nodes:
        if node.name not in known:
            ledger.upsert_node(
                node.name,
                NodeSpec(capacity=node_size(node)),
                health_reason=health_reason(node, node.name),
            )
    return node_views.list_nodes() if len(known) < len(slurm_nodes) else views
