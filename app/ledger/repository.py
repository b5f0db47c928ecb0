"""The ledger's ORM path: everything but the hot path (app.ledger.statements), on one
Session (one transaction): the nodes' changes, the listings and pages, the event log's
queries. Rows in, immutable records out (app.ledger.columns), but for the NodeRow objects
the node commands change in place."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, Row, Select, and_, bindparam, func, or_, select, tuple_
from sqlalchemy.orm import Session
from sqlalchemy.sql import Subquery

from app.core.ledger_errors import NodeNotFound
from app.core.records import (
    EventKind,
    HolderKind,
    Holding,
    HoldingState,
    LedgerEvent,
    NodeSpec,
    NodeTotals,
    NodeView,
)
from app.core.resources import Resources
from app.ledger.columns import (
    event_record,
    holding_record,
    node_record,
    node_spec,
    totals_record,
    triple,
    views,
)
from app.ledger.paging import HoldingKey, NodeKey, NodeSort, Page
from app.ledger.statements import HOLDINGS, NODES, LedgerStatements
from app.ledger.tables import EventRow, HoldingRow, NodeRow

T = TypeVar("T")

_HELD_BY_KIND = select(
    HOLDINGS.c.node_id,
    HOLDINGS.c.holder_kind,
    func.sum(HOLDINGS.c.cpu_millis).label("cpu"),
    func.sum(HOLDINGS.c.memory_bytes).label("memory"),
    func.sum(HOLDINGS.c.gpus).label("gpus"),
).group_by(HOLDINGS.c.node_id, HOLDINGS.c.holder_kind)

# Reading many nodes: a chunk of names or ids per IN list, well below any driver's limit.
IN_CHUNK = 500
_NODES_NAMED = select(NODES).where(NODES.c.name.in_(bindparam("names", expanding=True)))
# Holdings by position, as app.ledger.columns.views reads them.
_HOLDING_VALUES = select(
    HOLDINGS.c.node_id,
    HOLDINGS.c.holder_kind,
    HOLDINGS.c.holder_id,
    HOLDINGS.c.display_name,
    *(HOLDINGS.c[name] for name in triple()),
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
        query = select(NodeRow).where(or_(*(NODES.c[name] > 0 for name in triple("headroom_"))))
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
        return views(nodes, self.session.execute(_HOLDING_VALUES))

    def views_named(self, names: Collection[str]) -> list[NodeView]:
        """Those of the nodes called ``names`` that exist, with their holdings, by name: two
        queries per chunk of names, whatever the number of nodes in the ledger."""
        nodes: list[Row[Any]] = []
        for chunk in _chunks(sorted(names)):
            nodes.extend(self.session.execute(_NODES_NAMED, {"names": chunk}))
        holdings: list[Row[Any]] = []
        for chunk in _chunks([n.id for n in nodes]):
            holdings.extend(self.session.execute(_HOLDINGS_OF_NODES, {"node_ids": chunk}))
        return views(nodes, holdings)

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
