"""The ledger's operations, each one transaction.

Concurrency contract (see app.db.engine): every operation that changes a node's holdings
or capacity takes that node's row lock first and decides on the view it reads under the
lock, so concurrent callers, in one process or many, serialize per node. Admission never
leaves holdings above capacity - reserved. Snapshots from Slurm and forced capacity changes
record the truth even when it overcommits a node; such a node admits nothing until it is
back within capacity.

Every change to a node or its holdings appends an event naming the node in the same
transaction: followers of the log (app.ledger.snapshot, the GenericNode mirror) learn of
changes, from any replica, only that way.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Row
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.db.engine import Database
from app.db.locks import node_lock
from app.ledger.arithmetic import Shortfall, SnapshotDiff, diff_snapshot, shortfalls
from app.ledger.errors import (
    AdmissionRejected,
    CapacityBelowHoldings,
    HolderConflict,
    HoldingNotFound,
    InvalidRequest,
    NodeInUse,
    NodeNotFound,
)
from app.ledger.paging import HoldingKey, NodeKey, NodeSort, Page
from app.ledger.records import (
    EventKind,
    Holder,
    HolderKind,
    Holding,
    HoldingState,
    LedgerEvent,
    NodeSpec,
    NodeTotals,
    NodeView,
    Placement,
    Recorded,
    Recording,
    not_admissible_reason,
)
from app.ledger.repository import (
    LedgerRepository,
    LedgerStatements,
    event_values,
    holding_record,
)
from app.ledger.resources import ResourceName, Resources
from app.ledger.tables import HoldingRow, NodeRow
from app.quantities import format_cpu, format_memory

Clock = Callable[[], datetime]


def utcnow() -> datetime:
    return datetime.now(UTC)


def format_amount(resource: ResourceName, amount: int) -> str:
    match resource:
        case "cpu":
            return format_cpu(amount)
        case "memory":
            return format_memory(amount)
        case "gpu":
            return str(amount)


def describe_shortfalls(node: str, short: tuple[Shortfall, ...]) -> str:
    parts = [
        f"{s.resource}: requested {format_amount(s.resource, s.requested)}, "
        f"free {format_amount(s.resource, s.free)}"
        for s in short
    ]
    return f"insufficient resources on node {node!r}: " + "; ".join(parts)


def resources_details(resources: Resources) -> dict[str, int]:
    return {
        "cpu_millis": resources.cpu_millis,
        "memory_bytes": resources.memory_bytes,
        "gpus": resources.gpus,
    }


@dataclass(frozen=True, slots=True)
class Admission:
    holding: Holding
    created: bool


@dataclass(frozen=True, slots=True)
class SnapshotEntry:
    """What one holder keeps on a node according to an external system (Slurm)."""

    display_name: str
    resources: Resources


class Ledger:
    def __init__(self, db: Database, clock: Clock = utcnow) -> None:
        self.db = db
        self.clock = clock

    # reads

    def get_node(self, name: str) -> NodeView:
        with self.db.read() as session:
            repo = LedgerRepository(session)
            row = repo.find_node(name)
            if row is None:
                raise NodeNotFound(name)
            return repo.view(row)

    @contextmanager
    def exclusive(self, name: str) -> Iterator[NodeView]:
        """The node as it is once this caller holds it against every replica, which it
        does until the block ends (the contract is app.db.locks')."""
        with node_lock(self.db, name) as connection:
            with Session(bind=connection) as session:
                repo = LedgerRepository(session)
                row = repo.find_node(name)
                if row is None:
                    raise NodeNotFound(name)
                view = repo.view(row)
            yield view

    def list_nodes(self) -> list[NodeView]:
        with self.db.read() as session:
            return LedgerRepository(session).all_views()

    def views_named(self, names: Collection[str]) -> list[NodeView]:
        """Those of the nodes called ``names`` that exist, by name."""
        with self.db.read() as session:
            return LedgerRepository(session).views_named(names)

    def node_totals(self) -> list[NodeTotals]:
        """Every node with what each kind of holder holds in total (no holdings loaded)."""
        with self.db.read() as session:
            return LedgerRepository(session).all_totals()

    def node_specs(self) -> dict[str, NodeSpec]:
        """Every node's spec by name, without holdings (cheap at 15,000 nodes)."""
        with self.db.read() as session:
            return LedgerRepository(session).all_specs()

    def list_holdings(
        self, node: str | None = None, kind: HolderKind | None = None
    ) -> list[Holding]:
        with self.db.read() as session:
            repo = LedgerRepository(session)
            if node is not None and repo.find_node(node) is None:
                raise NodeNotFound(node)
            return [holding_record(h, n) for h, n in repo.list_holdings(node, kind)]

    def placements(
        self,
        kind: HolderKind,
        *,
        created_from: datetime | None = None,
        created_before: datetime | None = None,
    ) -> dict[str, Placement]:
        """Holder id -> placement of every holding of a single-node ``kind`` (pods, manual),
        optionally only those created in [created_from, created_before)."""
        return dict(self.each_placement(kind, created_from, created_before))

    def each_placement(
        self,
        kind: HolderKind,
        created_from: datetime | None = None,
        created_before: datetime | None = None,
    ) -> Iterator[tuple[str, Placement]]:
        """placements() one by one, read in batches: at 150,000 holdings the dict alone
        would be ~50 MB more at the peak of a resync. The read lasts until exhausted."""
        with self.db.read() as session:
            rows = LedgerRepository(session).placements(kind, created_from, created_before)
            for r in rows:
                amounts = Resources(r.cpu_millis, r.memory_bytes, r.gpus)
                yield r.holder_id, Placement(r.name, amounts, r.created_at)

    def node_page(
        self,
        limit: int,
        *,
        after: NodeKey | None = None,
        name_contains: str | None = None,
        sort: NodeSort = NodeSort.NAME,
    ) -> Page[NodeView, NodeKey]:
        """One keyset page of nodes (app.ledger.paging); ``name_contains`` matches the name
        or the Slurm alias, ignoring case."""
        with self.db.read() as session:
            return LedgerRepository(session).node_views_page(limit, after, name_contains, sort)

    def holdings_page(
        self,
        limit: int,
        *,
        node: str | None = None,
        kind: HolderKind | None = None,
        after: HoldingKey | None = None,
    ) -> Page[Holding, HoldingKey]:
        """One keyset page of list_holdings(node, kind); NodeNotFound for an unknown node."""
        with self.db.read() as session:
            repo = LedgerRepository(session)
            if node is not None and repo.find_node(node) is None:
                raise NodeNotFound(node)
            return repo.holdings_page(node, kind, limit, after)

    def last_event_id(self) -> int:
        """Where to start following the event log from now on."""
        with self.db.read() as session:
            return LedgerRepository(session).last_event_id()

    def events(
        self,
        *,
        node: str | None = None,
        kind: EventKind | None = None,
        since: datetime | None = None,
        after_id: int | None = None,
        limit: int = 100,
    ) -> list[LedgerEvent]:
        with self.db.read() as session:
            return LedgerRepository(session).events(
                node=node, kind=kind, since=since, after_id=after_id, limit=limit
            )

    def events_after(self, after_id: int, limit: int) -> list[LedgerEvent]:
        """Up to ``limit`` events after ``after_id``, in id order: what followers of the log
        poll (the node snapshot on every extender call), on a prebuilt statement."""
        with self.db.read_statements() as connection:
            return LedgerStatements(connection).events_after(after_id, limit)

    def events_with_ids(self, ids: list[int]) -> list[LedgerEvent]:
        """Those of ``ids`` that are committed now (app.ledger.follow looks for late ones)."""
        with self.db.read() as session:
            return LedgerRepository(session).events_with_ids(ids)

    # nodes

    def upsert_node(
        self,
        name: str,
        spec: NodeSpec,
        *,
        cordon_reason: str | None = None,
        force: bool = False,
        health_reason: str | None = None,
    ) -> tuple[NodeView, bool]:
        """Create or update a node; returns (view, created). Refuses to shrink capacity
        below what is held unless ``force`` (the node then admits nothing until it fits).
        ``health_reason``: a new node's, when the integration creating it knows it (a node
        registered from Slurm is never admissible before its Slurm state says so)."""
        try:
            return self._upsert_node(name, spec, cordon_reason, force, health_reason)
        except IntegrityError:
            # Another caller created the same node concurrently: now it is an update.
            return self._upsert_node(name, spec, cordon_reason, force, health_reason)

    def _upsert_node(
        self,
        name: str,
        spec: NodeSpec,
        cordon_reason: str | None,
        force: bool,
        health_reason: str | None,
    ) -> tuple[NodeView, bool]:
        now = self.clock()
        with self.db.write() as session:
            repo = LedgerRepository(session)
            row = repo.find_node(name, lock=True)
            created = row is None
            if row is None:
                row = NodeRow(name=name, health_reason=health_reason, created_at=now)
            else:
                held = repo.view(row).held
                if not force and not held.fits_within(spec.capacity - spec.reserved):
                    raise CapacityBelowHoldings(
                        f"node {name!r}: capacity minus reserved would be below what is "
                        f"held ({format_cpu(held.cpu_millis)} cpu, "
                        f"{format_memory(held.memory_bytes)} memory, {held.gpus} gpu); "
                        "release holdings first or pass force=true"
                    )
            before = None if created else repo.view(row).spec
            cordon_before = row.cordon_reason
            if not created and before == spec and cordon_before == cordon_reason:
                return repo.view(row), False  # nothing changes, nothing to record
            _apply_spec(row, spec)
            row.cordon_reason = cordon_reason
            row.updated_at = now
            if created:
                repo.add_node(row)
                repo.append_event(
                    now,
                    EventKind.NODE_CREATED,
                    name,
                    f"node created, not admissible: {health_reason}"
                    if health_reason
                    else "node created",
                    resources=spec.capacity,
                    details=_spec_details(spec),
                )
            elif before != spec:
                repo.append_event(
                    now,
                    EventKind.CAPACITY_CHANGED,
                    name,
                    "node spec changed",
                    resources=spec.capacity,
                    details={"before": _spec_details(before), "after": _spec_details(spec)},
                )
            if not created and cordon_before != cordon_reason:
                repo.append_event(
                    now,
                    EventKind.ADMISSIBILITY_CHANGED,
                    name,
                    f"cordoned: {cordon_reason}" if cordon_reason else "cordon cleared",
                    details={"cordon_before": cordon_before, "cordon_after": cordon_reason},
                )
            session.flush()
            return repo.view(row), created

    def set_health(self, name: str, reason: str | None) -> NodeView:
        """Record why an integration (Slurm) makes the node non-admissible (None: healthy)."""
        with self.db.write() as session:
            repo = LedgerRepository(session)
            row = repo.lock_node(name)
            if row.health_reason != reason:
                now = self.clock()
                repo.append_event(
                    now,
                    EventKind.ADMISSIBILITY_CHANGED,
                    name,
                    f"not admissible: {reason}" if reason else "admissible again",
                    details={"before": row.health_reason, "after": reason},
                )
                row.health_reason = reason
                row.updated_at = now
            return repo.view(row)

    def delete_node(self, name: str) -> None:
        with self.db.write() as session:
            repo = LedgerRepository(session)
            row = repo.lock_node(name)
            holdings = repo.holdings_on(row.id)
            if holdings:
                raise NodeInUse(
                    f"node {name!r} still has {len(holdings)} holding(s); release them first"
                )
            repo.delete_node(row)
            repo.append_event(self.clock(), EventKind.NODE_DELETED, name, "node deleted")

    # holdings

    def admit(
        self,
        node: str,
        holder: Holder,
        requests: Resources,
        *,
        state: HoldingState = HoldingState.HELD,
    ) -> Admission:
        """Atomic check-and-hold. Idempotent by holder: the same holder asking the same
        node for the same amounts gets its existing holding (created=False)."""
        try:
            return self._admit(node, holder, requests, state)
        except IntegrityError:
            # The same holder was admitted concurrently on another node; the retry sees it.
            return self._admit(node, holder, requests, state)

    def _admit(
        self, node: str, holder: Holder, requests: Resources, state: HoldingState
    ) -> Admission:
        now = self.clock()
        with self.db.write_statements() as connection:
            repo = LedgerStatements(connection)
            row = repo.lock_node_state(node)
            for existing in repo.single_node_holdings(holder.id, holder.kind):
                return Admission(_same_holding(existing, node, requests), False)
            allocatable = Resources(
                row.cpu_millis - row.reserved_cpu_millis,
                row.memory_bytes - row.reserved_memory_bytes,
                row.gpus - row.reserved_gpus,
            )
            free = allocatable - repo.held_on(row.id)
            rejection = _rejection(node, row.cordon_reason, row.health_reason, free, requests)
            if rejection is None:
                repo.insert_holding(_holding_values(row.id, holder, requests, state, now))
                repo.append_event(
                    now,
                    EventKind.ADMITTED,
                    node,
                    f"admitted {holder.display_name or holder.id}",
                    holder=holder,
                    resources=requests,
                    details={"state": state.value},
                )
                return Admission(Holding(node, holder, requests, state, now, now), True)
            repo.append_event(
                now,
                EventKind.REJECTED,
                node,
                rejection.message,
                holder=holder,
                resources=requests,
                details={"shortfalls": [s.resource for s in rejection.shortfalls]},
            )
        raise rejection

    def record(self, node: str, holder: Holder, requests: Resources, *, reason: str) -> Admission:
        """Record a holding that already exists outside the ledger (a pod another scheduler
        bound to the node). No fit check: the truth must be in the ledger even when it
        overcommits the node, which then admits nothing until it fits again. The holder's
        holding with other amounts or on another node (in-place resize) is replaced."""
        now = self.clock()
        with self.db.write() as session:
            repo = LedgerRepository(session)
            row = repo.lock_node_state(node)
            for existing in repo.single_node_holdings(holder.id, holder.kind):
                holding = holding_record(existing, existing.node_name)
                if existing.node_name == node and holding.resources == requests:
                    return Admission(holding, False)
                repo.delete_holding_returning(existing.id)
                if existing.node_name != node:  # the event below names only the new node
                    repo.append_events(
                        [_moved_event(now, existing.node_name, node, holding, reason)]
                    )
            repo.insert_holding(_holding_values(row.id, holder, requests, HoldingState.HELD, now))
            repo.append_events([_recorded_event(now, node, holder, requests, reason)])
            held = HoldingState.HELD
            return Admission(Holding(node, holder, requests, held, now, now), True)

    def record_many(self, entries: Sequence[Recording], *, reason: str) -> Recorded:
        """record() for many single-node holders in one transaction (a resync that finds
        thousands of pods the ledger lacks; one transaction each would take minutes). The
        entries' nodes are locked in name order; a holder already recorded as it is costs
        nothing; each holding written gets its event, as with record()."""
        try:
            return self._record_many(entries, reason)
        except IntegrityError:
            # One of the holders was admitted meanwhile: one by one, record() sorts it out.
            return self._record_each(entries, reason)

    def _record_each(self, entries: Sequence[Recording], reason: str) -> Recorded:
        changed: set[str] = set()
        unknown: list[Recording] = []
        for entry in entries:
            try:
                if self.record(entry.node, entry.holder, entry.resources, reason=reason).created:
                    changed.add(entry.node)
            except NodeNotFound:
                unknown.append(entry)
        return Recorded(frozenset(changed), tuple(unknown))

    def _record_many(self, entries: Sequence[Recording], reason: str) -> Recorded:
        now = self.clock()
        latest = {(e.holder.kind, e.holder.id): e for e in entries}  # the last entry wins
        with self.db.write_statements() as connection:
            repo = LedgerStatements(connection)
            node_ids = repo.lock_nodes([e.node for e in latest.values()])
            existing: dict[tuple[HolderKind, str], Row[Any]] = {}
            for kind in {kind for kind, _ in latest}:
                ids = [holder_id for k, holder_id in latest if k is kind]
                existing.update(((kind, r.holder_id), r) for r in repo.holdings_of(kind, ids))
            unknown: list[Recording] = []
            stale: list[int] = []
            holdings: list[dict[str, Any]] = []
            events: list[dict[str, Any]] = []
            changed: set[str] = set()
            for key, entry in latest.items():
                node_id = node_ids.get(entry.node)
                if node_id is None:
                    unknown.append(entry)
                    continue
                old = existing.get(key)
                if old is not None:
                    amounts = Resources(old.cpu_millis, old.memory_bytes, old.gpus)
                    if old.node_name == entry.node and amounts == entry.resources:
                        continue
                    stale.append(old.id)
                    if old.node_name != entry.node:  # its own event: followers go by node
                        changed.add(old.node_name)
                        moved = Recording(old.node_name, entry.holder, amounts)
                        events.append(_moved_event(now, old.node_name, entry.node, moved, reason))
                held = HoldingState.HELD
                holdings.append(_holding_values(node_id, entry.holder, entry.resources, held, now))
                events.append(
                    _recorded_event(now, entry.node, entry.holder, entry.resources, reason)
                )
                changed.add(entry.node)
            repo.delete_holdings(stale)
            repo.insert_holdings(holdings)
            repo.append_events(events)
        return Recorded(frozenset(changed), tuple(unknown))

    def pending_before(self, cutoff: datetime) -> list[Holding]:
        """Holdings still PENDING that were last touched before ``cutoff``."""
        with self.db.read() as session:
            return [
                holding_record(h, n) for h, n in LedgerRepository(session).pending_before(cutoff)
            ]

    def confirm(self, kind: HolderKind, holder_id: str) -> Holding:
        """PENDING -> HELD once the external system confirmed the hold."""
        with self.db.write_statements() as connection:
            repo = LedgerStatements(connection)
            found = self._locked_single(repo, holder_id, kind)
            now = self.clock()
            holding = holding_record(repo.confirm_holding_returning(found.id, now), found.node_name)
            # Followers of the log (app.ledger.snapshot) learn of every change from it.
            repo.append_event(
                now,
                EventKind.CONFIRMED,
                holding.node,
                f"confirmed {holding.holder.display_name or holding.holder.id}",
                holder=holding.holder,
                resources=holding.resources,
            )
            return holding

    def release(
        self, holder_id: str, kind: HolderKind | None = None, *, reason: str = "released"
    ) -> Holding:
        """Remove a pod's or manual holder's holding. Raises HoldingNotFound when there is
        none, so callers that want idempotence treat that as success."""
        if kind is HolderKind.SLURM_JOB:  # only the Slurm sync writes those (replace_holdings)
            raise InvalidRequest("slurm_job holdings are released by the Slurm sync only")
        with self.db.write_statements() as connection:
            repo = LedgerStatements(connection)
            found = self._locked_single(repo, holder_id, kind)
            deleted = repo.delete_holding_returning(found.id)
            if deleted is None:
                raise HoldingNotFound(holder_id)
            holding = holding_record(deleted, found.node_name)
            repo.append_event(
                self.clock(),
                EventKind.RELEASED,
                holding.node,
                reason,
                holder=holding.holder,
                resources=holding.resources,
            )
            return holding

    @staticmethod
    def _locked_single(repo: LedgerStatements, holder_id: str, kind: HolderKind | None) -> Row[Any]:
        """The holder's holding, re-read under its node's lock."""
        candidates = repo.single_node_holdings(holder_id, kind)
        if not candidates:
            raise HoldingNotFound(holder_id)
        if len(candidates) > 1:
            raise HolderConflict(
                f"holder id {holder_id!r} exists as both pod and manual; say which kind"
            )
        repo.lock_node_id(candidates[0].node_id)
        locked = repo.single_node_holdings(holder_id, HolderKind(candidates[0].holder_kind))
        if not locked:
            raise HoldingNotFound(holder_id)
        return locked[0]

    def replace_holdings(
        self, node: str, kind: HolderKind, snapshot: Mapping[str, SnapshotEntry]
    ) -> SnapshotDiff:
        """Make ``kind``'s holdings on ``node`` exactly ``snapshot`` in one transaction;
        one event lists the holders that came, went or changed."""
        now = self.clock()
        with self.db.write() as session:
            repo = LedgerRepository(session)
            row = repo.lock_node(node)
            rows = {h.holder_id: h for h in repo.holdings_on(row.id, kind)}
            diff = diff_snapshot(
                {k: Resources(h.cpu_millis, h.memory_bytes, h.gpus) for k, h in rows.items()},
                {k: e.resources for k, e in snapshot.items()},
            )
            if diff.is_empty:
                return diff
            for holder_id in diff.removed:
                repo.delete_holding(rows[holder_id])
            for holder_id in diff.changed:
                entry = snapshot[holder_id]
                _apply_amounts(rows[holder_id], entry.resources)
                rows[holder_id].display_name = entry.display_name
                rows[holder_id].updated_at = now
            for holder_id in diff.added:
                entry = snapshot[holder_id]
                repo.add_holding(
                    HoldingRow(
                        node_id=row.id,
                        holder_kind=kind.value,
                        holder_id=holder_id,
                        display_name=entry.display_name,
                        cpu_millis=entry.resources.cpu_millis,
                        memory_bytes=entry.resources.memory_bytes,
                        gpus=entry.resources.gpus,
                        state=HoldingState.HELD.value,
                        created_at=now,
                        updated_at=now,
                    )
                )
            total = Resources.total([e.resources for e in snapshot.values()])
            repo.append_event(
                now,
                EventKind.HOLDINGS_REPLACED,
                node,
                f"{kind.value} holdings replaced: +{len(diff.added)} -{len(diff.removed)} "
                f"~{len(diff.changed)}",
                resources=total,
                details={
                    "holder_kind": kind.value,
                    "added": list(diff.added),
                    "removed": list(diff.removed),
                    "changed": list(diff.changed),
                },
            )
            return diff

    def record_event(
        self, kind: EventKind, node: str | None, message: str, details: dict[str, Any] | None = None
    ) -> None:
        """Append an event for something that happened outside the ledger (a Slurm push)."""
        with self.db.write_statements() as connection:
            LedgerStatements(connection).append_event(
                self.clock(), kind, node, message, details=details
            )


def _rejection(
    node: str, cordon: str | None, health: str | None, free: Resources, requests: Resources
) -> AdmissionRejected | None:
    reason = not_admissible_reason(cordon, health, free)
    if reason:
        return AdmissionRejected(f"node {node!r} is not admissible: {reason}")
    short = shortfalls(requests, free)
    if short:
        return AdmissionRejected(describe_shortfalls(node, short), short)
    return None


def _moved_event(
    now: datetime, old: str, new: str, holding: Holding | Recording, reason: str
) -> dict[str, Any]:
    """A holder recorded on another node: released on the old one (followers go by node)."""
    return event_values(
        now,
        EventKind.RELEASED,
        old,
        f"moved to node {new!r}: {reason}",
        holder=holding.holder,
        resources=holding.resources,
    )


def _recorded_event(
    now: datetime, node: str, holder: Holder, resources: Resources, reason: str
) -> dict[str, Any]:
    return event_values(
        now,
        EventKind.ADMITTED,
        node,
        f"recorded {holder.display_name or holder.id}: {reason}",
        holder=holder,
        resources=resources,
        details={"recorded": True},
    )


def _holding_values(
    node_id: int, holder: Holder, requests: Resources, state: HoldingState, now: datetime
) -> dict[str, Any]:
    return {
        "node_id": node_id,
        "holder_kind": holder.kind.value,
        "holder_id": holder.id,
        "display_name": holder.display_name,
        "cpu_millis": requests.cpu_millis,
        "memory_bytes": requests.memory_bytes,
        "gpus": requests.gpus,
        "state": state.value,
        "created_at": now,
        "updated_at": now,
    }


def _same_holding(existing: Row[Any], node: str, requests: Resources) -> Holding:
    """The holder's existing holding when it is the same request, else a conflict."""
    holding = holding_record(existing, existing.node_name)
    if existing.node_name != node or holding.resources != requests:
        raise HolderConflict(
            f"holder {existing.holder_id!r} already holds "
            f"{format_cpu(existing.cpu_millis)} cpu, {format_memory(existing.memory_bytes)} "
            f"memory, {existing.gpus} gpu on node {existing.node_name!r}; release it first"
        )
    return holding


def _apply_amounts(row: NodeRow | HoldingRow, resources: Resources) -> None:
    row.cpu_millis = resources.cpu_millis
    row.memory_bytes = resources.memory_bytes
    row.gpus = resources.gpus


def _apply_spec(row: NodeRow, spec: NodeSpec) -> None:
    _apply_amounts(row, spec.capacity)
    row.reserved_cpu_millis = spec.reserved.cpu_millis
    row.reserved_memory_bytes = spec.reserved.memory_bytes
    row.reserved_gpus = spec.reserved.gpus
    row.slurm_name = spec.slurm_name
    row.labels = dict(spec.labels)


def _spec_details(spec: NodeSpec | None) -> dict[str, Any]:
    if spec is None:
        return {}
    return {
        "capacity": resources_details(spec.capacity),
        "reserved": resources_details(spec.reserved),
        "slurm_name": spec.slurm_name,
        "labels": spec.labels,
    }
