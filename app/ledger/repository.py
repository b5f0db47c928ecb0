"""SQL access for the ledger: rows in, immutable records out. No business rules here."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any, TypeVar, cast

from sqlalchemy import (
    ColumnElement,
    Connection,
    Row,
    Select,
    Table,
    and_,
    bindparam,
    delete,
    func,
    insert,
    literal_column,
    or_,
    select,
    tuple_,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session
from sqlalchemy.sql import Subquery

from app.core.ledger_errors import NodeNotFound
from app.core.records import (
    NO_HEADROOM,
    EventKind,
    Holder,
    HolderKind,
    Holding,
    HoldingState,
    LedgerEvent,
    NodeHeadroom,
    NodeSpec,
    NodeTotals,
    NodeView,
)
from app.core.resources import Resources
from app.ledger.paging import HoldingKey, NodeKey, NodeSort, Page
from app.ledger.tables import EventRow, HoldingRow, NodeRow, stored_devices

T = TypeVar("T")
SINGLE_NODE_KINDS = (HolderKind.POD.value, HolderKind.MANUAL.value)
NODES = cast(Table, NodeRow.__table__)
HOLDINGS = cast(Table, HoldingRow.__table__)
EVENTS = cast(Table, EventRow.__table__)

# Hot-path statements, built once: constructing a statement costs more than running it.
_NODE = select(NODES).where(NODES.c.name == bindparam("name"))
_LOCK_NODE = _NODE.with_for_update()
_HOLDINGS_ON = select(HOLDINGS).where(HOLDINGS.c.node_id == bindparam("node_id"))
_LOCK_NODE_ID = select(NODES).where(NODES.c.id == bindparam("node_id")).with_for_update()
_HELD_ON = (
    select(
        HOLDINGS.c.holder_kind,
        func.sum(HOLDINGS.c.cpu_millis),
        func.sum(HOLDINGS.c.memory_bytes),
        func.sum(HOLDINGS.c.gpus),
    )
    .where(HOLDINGS.c.node_id == bindparam("node_id"))
    .group_by(HOLDINGS.c.holder_kind)
)
# The GPU devices each holding on a node names (an admission naming devices only).
_DEVICES_ON = select(
    HOLDINGS.c.holder_kind, HOLDINGS.c.holder_id, HOLDINGS.c.display_name, HOLDINGS.c.devices
).where(HOLDINGS.c.node_id == bindparam("node_id"))
_HOLDER_HOLDINGS = (
    select(HOLDINGS, NODES.c.name.label("node_name"))
    .join(NODES, HOLDINGS.c.node_id == NODES.c.id)
    .where(
        HOLDINGS.c.holder_id == bindparam("holder_id"),
        HOLDINGS.c.holder_kind.in_(bindparam("kinds", expanding=True)),
    )
)
# Pods and manual holders are found through the partial unique index on (holder_kind,
# holder_id), which SQLite uses only when the query repeats the index's condition word for
# word (not as a bound parameter); without it, every admission and release scanned every
# holding (5.5 / 8.8 ms at 50,000 holdings instead of 1 ms).
_SINGLE_NODE_HOLDINGS = _HOLDER_HOLDINGS.where(
    HOLDINGS.c.holder_kind != literal_column(f"'{HolderKind.SLURM_JOB.value}'")
)
_LOCK_NODES = (
    select(NODES.c.id, NODES.c.name)
    .where(NODES.c.name.in_(bindparam("names", expanding=True)))
    .order_by(NODES.c.name)  # one order for every multi-node lock: no deadlock between them
    .with_for_update()
)
_HOLDINGS_OF = (
    select(HOLDINGS, NODES.c.name.label("node_name"))
    .join(NODES, HOLDINGS.c.node_id == NODES.c.id)
    .where(
        HOLDINGS.c.holder_kind == bindparam("kind"),
        HOLDINGS.c.holder_id.in_(bindparam("holder_ids", expanding=True)),
    )
)
_HELD_IN_SLURM = (
    select(HOLDINGS, NODES.c.name.label("node_name"))
    .join(NODES, HOLDINGS.c.node_id == NODES.c.id)
    .where(HOLDINGS.c.slurm_hold.is_not(None))
)
_HELD_BY_KIND = select(
    HOLDINGS.c.node_id,
    HOLDINGS.c.holder_kind,
    func.sum(HOLDINGS.c.cpu_millis).label("cpu"),
    func.sum(HOLDINGS.c.memory_bytes).label("memory"),
    func.sum(HOLDINGS.c.gpus).label("gpus"),
).group_by(HOLDINGS.c.node_id, HOLDINGS.c.holder_kind)
_DELETE_HOLDINGS = delete(HOLDINGS).where(HOLDINGS.c.id.in_(bindparam("ids", expanding=True)))
_INSERT_HOLDING = insert(HOLDINGS)
# A new holder's holding, or nothing when the holder holds already (any unique key).
_INSERT_NEW_HOLDING = {
    "postgresql": postgresql.insert(HOLDINGS).on_conflict_do_nothing().returning(HOLDINGS.c.id),
    "sqlite": sqlite.insert(HOLDINGS).on_conflict_do_nothing().returning(HOLDINGS.c.id),
}
_INSERT_EVENT = insert(EVENTS)
_DELETE_HOLDING = (
    delete(HOLDINGS).where(HOLDINGS.c.id == bindparam("holding_id")).returning(*HOLDINGS.c)
)
_CONFIRM_HOLDING = (
    update(HOLDINGS)
    .where(HOLDINGS.c.id == bindparam("holding_id"))
    .values(
        state=HoldingState.HELD.value,
        updated_at=bindparam("confirmed_at"),
        # The hold job's id when the confirmation has one; a confirmation without keeps
        # what an earlier one stored.
        slurm_hold=func.coalesce(bindparam("slurm_hold"), HOLDINGS.c.slurm_hold),
    )
    .returning(*HOLDINGS.c)
)
_EVENTS_AFTER = (
    select(EVENTS)
    .where(EVENTS.c.id > bindparam("after_id"))
    .order_by(EVENTS.c.id)
    .limit(bindparam("limit"))
)

# Reading many nodes: a chunk of names or ids per IN list, well below any driver's limit.
IN_CHUNK = 500
_NODES_NAMED = select(NODES).where(NODES.c.name.in_(bindparam("names", expanding=True)))
# Holdings by position: unpacking a row costs a fraction of reading its attributes by name.
_HOLDING_VALUES = select(
    HOLDINGS.c.node_id,
    HOLDINGS.c.holder_kind,
    HOLDINGS.c.holder_id,
    HOLDINGS.c.display_name,
    HOLDINGS.c.cpu_millis,
    HOLDINGS.c.memory_bytes,
    HOLDINGS.c.gpus,
    HOLDINGS.c.state,
    HOLDINGS.c.created_at,
    HOLDINGS.c.updated_at,
    HOLDINGS.c.devices,
    HOLDINGS.c.slurm_hold,
)
_HOLDINGS_OF_NODES = _HOLDING_VALUES.where(
    HOLDINGS.c.node_id.in_(bindparam("node_ids", expanding=True))
)


def _chunks(items: Sequence[T], size: int = IN_CHUNK) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _views(nodes: Sequence[Row[Any]], holdings: Iterable[Sequence[Any]]) -> list[NodeView]:
    """Node rows with the rows of _HOLDING_VALUES, in the nodes' order (holdings of other
    nodes, created after the nodes were read, are left out)."""
    names = {n.id: n.name for n in nodes}
    by_node: dict[int, list[Holding]] = {n.id: [] for n in nodes}
    for (
        node_id,
        kind,
        holder_id,
        display,
        cpu,
        memory,
        gpus,
        held,
        created,
        updated,
        devices,
        hold,
    ) in holdings:
        on_node = by_node.get(node_id)
        if on_node is not None:
            holder = Holder(_HOLDER_KINDS[kind], holder_id, display)
            resources, state = Resources(cpu, memory, gpus), _HOLDING_STATES[held]
            on_node.append(
                Holding(
                    names[node_id],
                    holder,
                    resources,
                    state,
                    created,
                    updated,
                    stored_devices(devices),
                    hold,
                )
            )
    return [_node_view(n, by_node[n.id]) for n in nodes]


# Sorting by a free amount: (capacity, reserved, holding) columns of that resource, and the
# amount held on each node that holds anything, to LEFT JOIN (a node without holdings: 0).
_FREE_COLUMNS = {
    NodeSort.FREE_CPU: (NODES.c.cpu_millis, NODES.c.reserved_cpu_millis, HOLDINGS.c.cpu_millis),
    NodeSort.FREE_MEMORY: (
        NODES.c.memory_bytes,
        NODES.c.reserved_memory_bytes,
        HOLDINGS.c.memory_bytes,
    ),
}
_HELD_BY_NODE: dict[NodeSort, Subquery] = {
    sort: select(HOLDINGS.c.node_id, func.sum(held).label("held"))
    .group_by(HOLDINGS.c.node_id)
    .subquery(f"held_{sort.value}")
    for sort, (_, _, held) in _FREE_COLUMNS.items()
}


def _free_column(sort: NodeSort) -> ColumnElement[int]:
    """capacity - reserved - held, for one resource, computed by the database."""
    capacity, reserved, _ = _FREE_COLUMNS[sort]
    held = _HELD_BY_NODE[sort].c.held
    return (capacity - reserved - func.coalesce(held, 0)).label("free")


# Enum members by value: a dict lookup costs a tenth of calling the enum, which counts
# when loading 150,000 holdings.
_HOLDER_KINDS = {k.value: k for k in HolderKind}
_HOLDING_STATES = {s.value: s for s in HoldingState}


def holding_record(row: HoldingRow | Row[Any], node_name: str) -> Holding:
    return Holding(
        node=node_name,
        holder=Holder(_HOLDER_KINDS[row.holder_kind], row.holder_id, row.display_name),
        resources=Resources(row.cpu_millis, row.memory_bytes, row.gpus),
        state=_HOLDING_STATES[row.state],
        created_at=row.created_at,
        updated_at=row.updated_at,
        devices=stored_devices(row.devices),
        slurm_hold=row.slurm_hold,
    )


def node_spec(row: NodeRow | Row[Any]) -> NodeSpec:
    return NodeSpec(
        capacity=Resources(row.cpu_millis, row.memory_bytes, row.gpus),
        reserved=Resources(row.reserved_cpu_millis, row.reserved_memory_bytes, row.reserved_gpus),
        slurm_name=row.slurm_name,
        labels=dict(row.labels or {}),
    )


def node_record(row: NodeRow | Row[Any], holdings: Sequence[HoldingRow | Row[Any]]) -> NodeView:
    return _node_view(row, [holding_record(h, row.name) for h in holdings])


def totals_record(row: NodeRow | Row[Any], held_by_kind: dict[HolderKind, Resources]) -> NodeTotals:
    return NodeTotals(
        row.name,
        node_spec(row),
        row.cordon_reason,
        row.health_reason,
        held_by_kind,
        node_headroom(row),
    )


def node_headroom(row: NodeRow | Row[Any]) -> NodeHeadroom:
    target = Resources(row.headroom_cpu_millis, row.headroom_memory_bytes, row.headroom_gpus)
    granted = Resources(row.granted_cpu_millis, row.granted_memory_bytes, row.granted_gpus)
    if row.headroom_used_at is None and target.is_zero() and granted.is_zero():
        return NO_HEADROOM
    return NodeHeadroom(target, granted, row.headroom_used_at)


def headroom_values(headroom: NodeHeadroom) -> dict[str, Any]:
    """The node columns that hold ``headroom``."""
    target, granted = headroom.target, headroom.granted
    return {
        "headroom_cpu_millis": target.cpu_millis,
        "headroom_memory_bytes": target.memory_bytes,
        "headroom_gpus": target.gpus,
        "granted_cpu_millis": granted.cpu_millis,
        "granted_memory_bytes": granted.memory_bytes,
        "granted_gpus": granted.gpus,
        "headroom_used_at": headroom.used_at,
    }


# Hot path too (an admission records its use of the headroom): built once.
_SET_HEADROOM = (
    update(NODES)
    .where(NODES.c.id == bindparam("node_id"))
    .values({name: bindparam(f"new_{name}") for name in headroom_values(NO_HEADROOM)})
)


def _node_view(row: NodeRow | Row[Any], holdings: list[Holding]) -> NodeView:
    return NodeView(
        name=row.name,
        spec=node_spec(row),
        cordon_reason=row.cordon_reason,
        health_reason=row.health_reason,
        holdings=tuple(sorted(holdings, key=lambda h: (h.holder.kind, h.holder.id))),
        created_at=row.created_at,
        updated_at=row.updated_at,
        headroom=node_headroom(row),
    )


def event_record(row: EventRow | Row[Any]) -> LedgerEvent:
    resources = (
        None
        if row.cpu_millis is None
        else Resources(row.cpu_millis, row.memory_bytes or 0, row.gpus or 0)
    )
    return LedgerEvent(
        id=row.id,
        at=row.at,
        kind=EventKind(row.kind),
        node=row.node,
        holder_kind=HolderKind(row.holder_kind) if row.holder_kind else None,
        holder_id=row.holder_id,
        resources=resources,
        message=row.message,
        details=dict(row.details or {}),
    )


def event_values(
    at: datetime,
    kind: EventKind,
    node: str | None,
    message: str,
    *,
    holder: Holder | None = None,
    resources: Resources | None = None,
    details: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "at": at,
        "kind": kind.value,
        "node": node,
        "holder_kind": holder.kind.value if holder else None,
        "holder_id": holder.id if holder else None,
        "cpu_millis": resources.cpu_millis if resources else None,
        "memory_bytes": resources.memory_bytes if resources else None,
        "gpus": resources.gpus if resources else None,
        "message": message,
        "details": details or {},
    }


class LedgerStatements:
    """The hot path's SQL (admit, release): prebuilt Core statements that run on a bare
    connection or a Session alike, a fraction of the ORM's cost per call."""

    def __init__(self, session: Connection | Session) -> None:
        self.session = session

    def lock_node_state(self, name: str) -> Row[Any]:
        """The node's columns, row-locked until the transaction ends."""
        row = self.session.execute(_LOCK_NODE, {"name": name}).one_or_none()
        if row is None:
            raise NodeNotFound(name)
        return row

    def node_view(self, name: str, *, lock: bool = False) -> tuple[int, NodeView]:
        """The node's id and view (row-locked with ``lock``), in two prebuilt statements:
        the Slurm pusher reads one on every push."""
        row = self.session.execute(_LOCK_NODE if lock else _NODE, {"name": name}).one_or_none()
        if row is None:
            raise NodeNotFound(name)
        holdings = self.session.execute(_HOLDINGS_ON, {"node_id": row.id})
        return row.id, node_record(row, list(holdings))

    def set_headroom(self, node_id: int, headroom: NodeHeadroom) -> None:
        values = {f"new_{k}": v for k, v in headroom_values(headroom).items()}
        self.session.execute(_SET_HEADROOM, {"node_id": node_id, **values})

    def lock_node_id(self, node_id: int) -> Row[Any]:
        """The node's columns by id, row-locked until the transaction ends."""
        return self.session.execute(_LOCK_NODE_ID, {"node_id": node_id}).one()

    def held_on(self, node_id: int) -> dict[HolderKind, Resources]:
        """What each kind of holder holds on the node, summed by the database."""
        rows = self.session.execute(_HELD_ON, {"node_id": node_id})
        return {
            _HOLDER_KINDS[kind]: Resources(int(cpu), int(memory), int(gpus))
            for kind, cpu, memory, gpus in rows
        }

    def devices_on(self, node_id: int) -> list[tuple[Holder, tuple[int, ...]]]:
        """The holders on the node that hold GPU devices by identity, with those devices."""
        rows = self.session.execute(_DEVICES_ON, {"node_id": node_id})
        return [
            (Holder(_HOLDER_KINDS[kind], holder_id, display), tuple(d["index"] for d in devices))
            for kind, holder_id, display, devices in rows
            if devices
        ]

    def single_node_holdings(self, holder_id: str, kind: HolderKind | None) -> list[Row[Any]]:
        """A pod's or manual holder's holding rows with their node's name."""
        kinds = SINGLE_NODE_KINDS if kind is None else (kind.value,)
        params = {"holder_id": holder_id, "kinds": list(kinds)}
        single = kind is None or kind.value in SINGLE_NODE_KINDS
        return list(
            self.session.execute(_SINGLE_NODE_HOLDINGS if single else _HOLDER_HOLDINGS, params)
        )

    def events_after(self, after_id: int, limit: int) -> list[LedgerEvent]:
        rows = self.session.execute(_EVENTS_AFTER, {"after_id": after_id, "limit": limit})
        return [event_record(r) for r in rows]

    def lock_nodes(self, names: Sequence[str]) -> dict[str, int]:
        """Name -> id of those of ``names`` that exist, row-locked in name order."""
        rows = self.session.execute(_LOCK_NODES, {"names": sorted(set(names))})
        return {row.name: row.id for row in rows}

    def holdings_of(self, kind: HolderKind, holder_ids: Sequence[str]) -> list[Row[Any]]:
        """``kind``'s holding rows of these holders, with their node's name."""
        params = {"kind": kind.value, "holder_ids": list(holder_ids)}
        return list(self.session.execute(_HOLDINGS_OF, params))

    def held_in_slurm(self) -> list[Row[Any]]:
        """The holding rows a Slurm hold job holds (GPU devices), with their node's name."""
        return list(self.session.execute(_HELD_IN_SLURM))

    def insert_holding(self, values: dict[str, Any]) -> None:
        self.session.execute(_INSERT_HOLDING, values)

    def insert_new_holding(self, values: dict[str, Any]) -> bool:
        """Insert the holding unless its holder holds already; whether it was inserted.
        One statement where a look first would be two: the admission's hot path."""
        bind = self.session.get_bind() if isinstance(self.session, Session) else self.session
        inserted = self.session.execute(_INSERT_NEW_HOLDING[bind.dialect.name], values)
        return inserted.first() is not None

    def insert_holdings(self, values: Sequence[dict[str, Any]]) -> None:
        if values:
            self.session.execute(_INSERT_HOLDING, list(values))

    def delete_holdings(self, ids: Sequence[int]) -> None:
        if ids:
            self.session.execute(_DELETE_HOLDINGS, {"ids": list(ids)})

    def delete_holding_returning(self, holding_id: int) -> Row[Any] | None:
        return self.session.execute(_DELETE_HOLDING, {"holding_id": holding_id}).one_or_none()

    def confirm_holding_returning(
        self, holding_id: int, at: datetime, slurm_hold: str | None = None
    ) -> Row[Any]:
        """PENDING -> HELD; ``slurm_hold``: the hold job's id, kept when None."""
        values = {"holding_id": holding_id, "confirmed_at": at, "slurm_hold": slurm_hold}
        return self.session.execute(_CONFIRM_HOLDING, values).one()

    def append_event(
        self,
        at: datetime,
        kind: EventKind,
        node: str | None,
        message: str,
        *,
        holder: Holder | None = None,
        resources: Resources | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        self.insert_event(
            event_values(
                at, kind, node, message, holder=holder, resources=resources, details=details
            )
        )

    def insert_event(self, values: dict[str, Any]) -> None:
        """One event (from event_values, app.ledger.events)."""
        self.session.execute(_INSERT_EVENT, values)

    def append_events(self, values: Sequence[dict[str, Any]]) -> None:
        """Many events (each from event_values) in one statement."""
        if values:
            self.session.execute(_INSERT_EVENT, list(values))


class LedgerRepository(LedgerStatements):
    """All SQL of the ledger, bound to one Session (one transaction)."""

    session: Session

    def __init__(self, session: Session) -> None:
        super().__init__(session)

    # nodes

    def find_node(self, name: str, *, lock: bool = False) -> NodeRow | None:
        query = select(NodeRow).where(NodeRow.name == name)
        if lock:
            query = query.with_for_update()
        return self.session.scalars(query).one_or_none()

    def node_mapped_to(self, slurm_name: str) -> str | None:
        """The ledger node that maps to Slurm node ``slurm_name``, if one does."""
        target = func.coalesce(NodeRow.slurm_name, NodeRow.name)
        return self.session.scalars(select(NodeRow.name).where(target == slurm_name)).one_or_none()

    def lock_node(self, name: str) -> NodeRow:
        """The node's row, locked until the transaction ends (see app.db.engine)."""
        row = self.find_node(name, lock=True)
        if row is None:
            raise NodeNotFound(name)
        return row

    def view(self, row: NodeRow) -> NodeView:
        return node_record(row, self.holdings_on(row.id))

    def nodes_with_headroom(self, *, lock: bool = False) -> list[NodeRow]:
        """The nodes whose headroom target is not zero."""
        query = select(NodeRow).where(
            or_(
                NodeRow.headroom_cpu_millis > 0,
                NodeRow.headroom_memory_bytes > 0,
                NodeRow.headroom_gpus > 0,
            )
        )
        if lock:
            query = query.order_by(NodeRow.name).with_for_update()
        return list(self.session.scalars(query))

    def all_totals(self) -> list[NodeTotals]:
        """Every node with its holdings summed by holder kind in the database."""
        held: dict[int, dict[HolderKind, Resources]] = {}
        for row in self.session.execute(_HELD_BY_KIND):
            sums = Resources(int(row.cpu), int(row.memory), int(row.gpus))
            held.setdefault(row.node_id, {})[HolderKind(row.holder_kind)] = sums
        return [
            totals_record(n, held.get(n.id, {}))
            for n in self.session.scalars(select(NodeRow).order_by(NodeRow.name))
        ]

    def all_specs(self) -> dict[str, NodeSpec]:
        return {n.name: node_spec(n) for n in self.session.scalars(select(NodeRow))}

    def all_views(self) -> list[NodeView]:
        """Every node with its holdings, by name: two queries, Core rows (ORM objects
        cost three times as much at 15,000 nodes)."""
        nodes = list(self.session.execute(select(NODES).order_by(NODES.c.name)))
        return _views(nodes, self.session.execute(_HOLDING_VALUES))

    def views_named(self, names: Collection[str]) -> list[NodeView]:
        """Those of the nodes called ``names`` that exist, with their holdings, by name: two
        queries per chunk of names, whatever the number of nodes in the ledger."""
        nodes: list[Row[Any]] = []
        for chunk in _chunks(sorted(names)):
            nodes.extend(self.session.execute(_NODES_NAMED, {"names": chunk}))
        holdings: list[Row[Any]] = []
        for chunk in _chunks([n.id for n in nodes]):
            holdings.extend(self.session.execute(_HOLDINGS_OF_NODES, {"node_ids": chunk}))
        return _views(nodes, holdings)

    def node_views_page(
        self, limit: int, after: NodeKey | None, name_contains: str | None, sort: NodeSort
    ) -> Page[NodeView, NodeKey]:
        """Up to ``limit`` nodes in ``sort`` order, starting after ``after``; only the page's
        nodes' holdings are read, so a page costs the same at any depth. Sorted by name it
        walks the name index; sorted by free it must know every (filtered) node's free
        amount, which the database computes from the holdings grouped by node."""
        query: Select[Any] = select(NodeRow)
        if name_contains is not None:
            query = query.where(
                or_(
                    NodeRow.name.icontains(name_contains, autoescape=True),
                    NodeRow.slurm_name.icontains(name_contains, autoescape=True),
                )
            )
        free: ColumnElement[int] | None = None
        if sort is NodeSort.NAME:
            if after is not None:
                query = query.where(NodeRow.name > after.name)
            query = query.order_by(NodeRow.name)
        else:
            free = _free_column(sort)
            held = _HELD_BY_NODE[sort]
            query = query.add_columns(free).outerjoin(held, held.c.node_id == NodeRow.id)
            if after is not None:
                # Most free first, ties by name: strictly after (after.free, after.name).
                query = query.where(
                    or_(free < after.free, and_(free == after.free, NodeRow.name > after.name))
                )
            query = query.order_by(free.desc(), NodeRow.name)
        rows: list[Row[Any]] = list(self.session.execute(query.limit(limit + 1)))
        nodes: list[NodeRow] = [r[0] for r in rows[:limit]]
        holdings: dict[int, list[HoldingRow]] = {n.id: [] for n in nodes}
        if nodes:
            page_holdings = select(HoldingRow).where(HoldingRow.node_id.in_(list(holdings)))
            for holding in self.session.scalars(page_holdings):
                holdings[holding.node_id].append(holding)
        items = tuple(node_record(n, holdings[n.id]) for n in nodes)
        if len(rows) <= limit:
            return Page(items, None)
        last = rows[limit - 1]
        return Page(items, NodeKey(last.NodeRow.name, None if free is None else int(last.free)))

    def add_node(self, row: NodeRow) -> None:
        self.session.add(row)
        self.session.flush()

    def delete_node(self, row: NodeRow) -> None:
        self.session.delete(row)
        self.session.flush()

    # holdings

    def holdings_on(self, node_id: int, kind: HolderKind | None = None) -> list[HoldingRow]:
        query = select(HoldingRow).where(HoldingRow.node_id == node_id)
        if kind is not None:
            query = query.where(HoldingRow.holder_kind == kind.value)
        return list(self.session.scalars(query))

    def list_holdings(
        self, node: str | None, kind: HolderKind | None
    ) -> list[tuple[HoldingRow, str]]:
        query = select(HoldingRow, NodeRow.name).join(NodeRow, HoldingRow.node_id == NodeRow.id)
        if node is not None:
            query = query.where(NodeRow.name == node)
        if kind is not None:
            query = query.where(HoldingRow.holder_kind == kind.value)
        query = query.order_by(NodeRow.name, HoldingRow.holder_kind, HoldingRow.holder_id)
        return [(h, name) for h, name in self.session.execute(query)]

    def placements(
        self, kind: HolderKind, created_from: datetime | None, created_before: datetime | None
    ) -> Iterator[Row[Any]]:
        """(holder_id, node name, cpu, memory, gpus, created_at) rows of ``kind``: plain
        columns, no ORM objects, streamed in batches (a resync reads 150,000 of them)."""
        query = (
            select(
                HoldingRow.holder_id,
                NodeRow.name,
                HoldingRow.cpu_millis,
                HoldingRow.memory_bytes,
                HoldingRow.gpus,
                HoldingRow.created_at,
            )
            .join(NodeRow, HoldingRow.node_id == NodeRow.id)
            .where(HoldingRow.holder_kind == kind.value)
        )
        if created_from is not None:
            query = query.where(HoldingRow.created_at >= created_from)
        if created_before is not None:
            query = query.where(HoldingRow.created_at < created_before)
        return iter(self.session.execute(query.execution_options(yield_per=5000)))

    def pending_before(self, cutoff: datetime) -> list[tuple[HoldingRow, str]]:
        query = (
            select(HoldingRow, NodeRow.name)
            .join(NodeRow, HoldingRow.node_id == NodeRow.id)
            .where(HoldingRow.state == HoldingState.PENDING.value, HoldingRow.updated_at < cutoff)
        )
        return [(h, name) for h, name in self.session.execute(query)]

    def holdings_page(
        self, node: str | None, kind: HolderKind | None, limit: int, after: HoldingKey | None
    ) -> Page[Holding, HoldingKey]:
        """Up to ``limit`` holdings in list_holdings' order, starting after ``after``."""
        query = select(HoldingRow, NodeRow.name).join(NodeRow, HoldingRow.node_id == NodeRow.id)
        if node is not None:
            query = query.where(NodeRow.name == node)
        if kind is not None:
            query = query.where(HoldingRow.holder_kind == kind.value)
        if after is not None:
            key = (after.node, after.holder_kind.value, after.holder_id)
            query = query.where(
                tuple_(NodeRow.name, HoldingRow.holder_kind, HoldingRow.holder_id) > tuple_(*key),
                # Implied by the above, but only this lets PostgreSQL start the name index
                # scan at the key (0.3 ms instead of 22 ms half-way through 45,000 holdings).
                NodeRow.name >= after.node,
            )
        query = query.order_by(NodeRow.name, HoldingRow.holder_kind, HoldingRow.holder_id)
        rows = [(h, name) for h, name in self.session.execute(query.limit(limit + 1))]
        items = tuple(holding_record(h, name) for h, name in rows[:limit])
        last = items[-1] if len(rows) > limit else None
        key_of = None if last is None else HoldingKey(last.node, last.holder.kind, last.holder.id)
        return Page(items, key_of)

    def add_holding(self, row: HoldingRow) -> None:
        self.session.add(row)
        self.session.flush()

    def delete_holding(self, row: HoldingRow) -> None:
        self.session.delete(row)
        self.session.flush()

    # events

    def last_event_id(self) -> int:
        return int(self.session.scalar(select(func.max(EventRow.id))) or 0)

    def events(
        self,
        *,
        node: str | None,
        kind: EventKind | None,
        since: datetime | None,
        after_id: int | None,
        limit: int,
    ) -> list[LedgerEvent]:
        query = select(EventRow)
        if node is not None:
            query = query.where(EventRow.node == node)
        if kind is not None:
            query = query.where(EventRow.kind == kind.value)
        if since is not None:
            query = query.where(EventRow.at >= since)
        if after_id is not None:
            query = query.where(EventRow.id > after_id)
        rows = self.session.scalars(query.order_by(EventRow.id).limit(limit))
        return [event_record(r) for r in rows]

    def events_with_ids(self, ids: list[int]) -> list[LedgerEvent]:
        query = select(EventRow).where(EventRow.id.in_(ids)).order_by(EventRow.id)
        rows = self.session.scalars(query)
        return [event_record(r) for r in rows]
