"""What a Slurm administrator reads on a node: who holds what the k8s counts withhold. Pure.

A job that waits (``Reason=Resources``) on a shared node waits for what Kubernetes holds,
which Slurm shows only as lowered k8scpu/k8smemory/k8sgpu totals. The push writes this
text into the node's ``comment`` (``scontrol show node``, ``sinfo -O nodehost,comment``)
so the holders have names there:

    nodeledger: k8s withholds cpu=8 mem=16384M gpu=1: pods default/web-1 ml/train-0 +1
    more; headroom cpu=2 mem=4096M

A comment someone else wrote is never replaced (``ours``): it is the administrator's field.
The text is as of the last count change the service pushed; ``GET /v1/nodes/{name}`` has
the holdings themselves.
"""

from __future__ import annotations

from app.core.counts import SlurmUnits
from app.core.records import HolderKind, NodeView
from app.core.resources import Resources

PREFIX = "nodeledger:"
MAX_NAMES = 5  # a line an administrator can read; the rest are counted


def ours(comment: str) -> bool:
    """Whether the node's comment is free for the service: empty, or written by it."""
    return comment == "" or comment.startswith(PREFIX)


def node_comment(view: NodeView, total: SlurmUnits) -> str:
    """The comment for ``view``, whose counts withhold ``total`` (app.core.counts.withheld,
    which the push has computed already): "" when that is nothing (ours is cleared)."""
    if total == SlurmUnits(0, 0, 0):
        return ""
    parts = [f"{PREFIX} k8s withholds {_amounts(total)}"]
    for kind, label in ((HolderKind.POD, "pods"), (HolderKind.MANUAL, "reservations")):
        names = sorted(
            h.holder.display_name or h.holder.id for h in view.holdings if h.holder.kind is kind
        )
        if names:
            more = len(names) - MAX_NAMES
            shown = " ".join(names[:MAX_NAMES]) + (f" +{more} more" if more > 0 else "")
            parts.append(f"{label} {shown}")
    if view.headroom.target != Resources.ZERO:
        parts.append(f"headroom {_amounts(SlurmUnits.of(view.headroom.target))}")
    if view.health_reason is not None and any(h.devices for h in view.holdings):
        parts.append("every GPU while the node is not admissible")
    return parts[0] + ": " + "; ".join(parts[1:]) if len(parts) > 1 else parts[0]


def _amounts(units: SlurmUnits) -> str:
    text = f"cpu={units.cpus} mem={units.memory_mb}M"
    return text + (f" gpu={units.gpus}" if units.gpus else "")
