"""Immutable records the ledger hands out: holders, holdings, node views and events."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from app.core.resources import Resources
from app.core.verdict import not_admissible_reason


class HolderKind(StrEnum):
    """Who keeps resources on a node."""

    POD = "pod"
    SLURM_JOB = "slurm_job"
    MANUAL = "manual"


class HoldingState(StrEnum):
    """PENDING: held while an external system (Slurm) confirms; counts as used.
    HELD: admitted."""

    PENDING = "pending"
    HELD = "held"


class EventKind(StrEnum):
    NODE_CREATED = "node_created"
    CAPACITY_CHANGED = "capacity_changed"
    NODE_DELETED = "node_deleted"
    ADMISSIBILITY_CHANGED = "admissibility_changed"
    ADMITTED = "admitted"
    CONFIRMED = "confirmed"
    REJECTED = "rejected"
    RELEASED = "released"
    HOLDINGS_REPLACED = "holdings_replaced"
    SLURM_PUSHED = "slurm_pushed"
    SLURM_DRIFT = "slurm_drift"
    HEADROOM = "headroom"
    MAINTENANCE = "maintenance"  # a drain, cordon or taint relayed between the two sides


@dataclass(frozen=True, slots=True)
class Holder:
    """Identity of a holder: (kind, id) is unique across the ledger, except Slurm jobs,
    which hold on several nodes under one job id."""

    kind: HolderKind
    id: str
    display_name: str = ""


@dataclass(frozen=True, slots=True)
class HeldDevice:
    """A GPU device held by identity: its index on the node, and its UUID ("" when
    not known), informational only: never checked, not part of what makes a retry the same
    admission. One object per device, as Kubernetes' own DRA allocation results are."""

    index: int
    uuid: str = ""


@dataclass(frozen=True, slots=True)
class Holding:
    """What a holder keeps on a node. ``devices``: the GPU devices on the node it holds by
    identity, by index (() = its GPUs are counted only);
    ``slurm_hold``: the Slurm job that holds those devices for it, once confirmed."""

    node: str
    holder: Holder
    resources: Resources
    state: HoldingState
    created_at: datetime
    updated_at: datetime
    devices: tuple[HeldDevice, ...] = ()
    slurm_hold: str | None = None

    @property
    def device_indices(self) -> tuple[int, ...]:
        """The indices of ``devices``: what the rules (app.core.devices) and Slurm go by."""
        return tuple(d.index for d in self.devices)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a single-node holder holds what, and since when: the little a reconciler
    compares against its own view (a pod's node and request), without the full record."""

    node: str
    resources: Resources
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Recording:
    """A holding that exists outside the ledger (a bound pod), to record as it is;
    ``allocated``: what its kubelet allocated to it, when it reports that (in-place
    resize, app.core.pods.resize)."""

    node: str
    holder: Holder
    resources: Resources
    allocated: Resources | None = None


@dataclass(frozen=True, slots=True)
class Recorded:
    """What Ledger.record_many did: the nodes whose holdings changed, and the entries it
    skipped because the ledger has no such node."""

    changed: frozenset[str]
    unknown_node: tuple[Recording, ...]


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """What an operator or a discovery controller says about a node."""

    capacity: Resources
    reserved: Resources = Resources.ZERO
    slurm_name: str | None = None
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class NodeHeadroom:
    """A node's Kubernetes headroom (app.core.headroom): ``target``, what is kept withheld
    from Slurm beyond what pods and reservations hold (zero when idle); ``granted``, what
    Slurm was last confirmed to withhold with no job using it; ``used_at``, the last
    admission on the node."""

    target: Resources = Resources.ZERO
    granted: Resources = Resources.ZERO
    used_at: datetime | None = None


NO_HEADROOM = NodeHeadroom()


@dataclass(frozen=True, slots=True)
class NodeView:
    """A consistent snapshot of one node with its holdings and derived sums."""

    name: str
    spec: NodeSpec
    cordon_reason: str | None
    health_reason: str | None
    holdings: tuple[Holding, ...]
    created_at: datetime
    updated_at: datetime
    headroom: NodeHeadroom = NO_HEADROOM
    # Sums per holder kind, and free, computed once: a view never changes, and the
    # extender reads them for a thousand nodes per call.
    _held_by_kind: dict[HolderKind, Resources] = field(init=False, repr=False, compare=False)
    # Plain fields rather than properties: the cheapest reads for the extender's loop.
    allocatable: Resources = field(init=False, repr=False, compare=False)
    free: Resources = field(init=False, repr=False, compare=False)  # < 0: overcommitted
    # Why no new holding is admitted here, or None when the node is admissible.
    not_admissible_reason: str | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_kind: dict[HolderKind, list[Resources]] = {}
        for holding in self.holdings:
            by_kind.setdefault(holding.holder.kind, []).append(holding.resources)
        held_by_kind = {kind: Resources.total(amounts) for kind, amounts in by_kind.items()}
        object.__setattr__(self, "_held_by_kind", held_by_kind)
        _derive(self, held_by_kind)

    @property
    def slurm_name(self) -> str:
        """The node's name in Slurm: its alias, else the same name."""
        return self.spec.slurm_name or self.name

    def held_by(self, *kinds: HolderKind) -> Resources:
        if len(kinds) == 1:
            return self._held_by_kind.get(kinds[0], Resources.ZERO)
        return Resources.total([self._held_by_kind[k] for k in kinds if k in self._held_by_kind])

    @property
    def held_by_kubernetes(self) -> Resources:
        return self.held_by(HolderKind.POD)

    @property
    def held_by_slurm(self) -> Resources:
        return self.held_by(HolderKind.SLURM_JOB)

    @property
    def held_manually(self) -> Resources:
        return self.held_by(HolderKind.MANUAL)

    @property
    def held(self) -> Resources:
        return Resources.total(self._held_by_kind.values())

    @property
    def admissible(self) -> bool:
        return self.not_admissible_reason is None


@dataclass(frozen=True, slots=True)
class NodeTotals:
    """A node with what each kind of holder holds on it in total, but not the holdings:
    what a summary of every node needs (the metrics without the snapshot) and what the
    ledger's admit decides on, read without loading the holdings."""

    name: str
    spec: NodeSpec
    cordon_reason: str | None
    health_reason: str | None
    held_by_kind: dict[HolderKind, Resources]
    headroom: NodeHeadroom = NO_HEADROOM
    # Computed once, as NodeView's; plain fields so that the two read alike.
    allocatable: Resources = field(init=False, repr=False, compare=False)
    free: Resources = field(init=False, repr=False, compare=False)  # < 0: overcommitted
    # Why no new holding is admitted here, or None when the node is admissible.
    not_admissible_reason: str | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _derive(self, self.held_by_kind)

    @property
    def held_by_kubernetes(self) -> Resources:
        return self.held_by_kind.get(HolderKind.POD, Resources.ZERO)

    @property
    def held_by_slurm(self) -> Resources:
        return self.held_by_kind.get(HolderKind.SLURM_JOB, Resources.ZERO)

    @property
    def held_manually(self) -> Resources:
        return self.held_by_kind.get(HolderKind.MANUAL, Resources.ZERO)


def _derive(node: NodeView | NodeTotals, held_by_kind: dict[HolderKind, Resources]) -> None:
    """Set a view's allocatable, free and not-admissible reason, once (it never changes)."""
    allocatable = node.spec.capacity - node.spec.reserved
    free = allocatable - Resources.total(held_by_kind.values())
    reason = not_admissible_reason(node.cordon_reason, node.health_reason, free)
    object.__setattr__(node, "allocatable", allocatable)
    object.__setattr__(node, "free", free)
    object.__setattr__(node, "not_admissible_reason", reason)


@dataclass(frozen=True, slots=True)
class LedgerEvent:
    id: int
    at: datetime
    kind: EventKind
    node: str | None
    holder_kind: HolderKind | None
    holder_id: str | None
    resources: Resources | None
    message: str
    details: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Admission:
    """What an admission or a recording did: the holding, and whether it is new."""

    holding: Holding
    created: bool
    refill: bool = False  # confirmed inside the node's headroom, which is now running low


@dataclass(frozen=True, slots=True)
class Release:
    """What a release did: the holding gone, and whether what Slurm must withhold on its
    node fell (else what it freed stayed withheld as the node's headroom: no push)."""

    holding: Holding
    withheld_fell: bool = True


@dataclass(frozen=True, slots=True)
class SnapshotEntry:
    """What one holder keeps on a node according to an external system (Slurm)."""

    display_name: str
    resources: Resources
