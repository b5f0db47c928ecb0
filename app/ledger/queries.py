"""The ledger's reads: nodes, holdings, placements, pages and the event log. Each is one
read transaction (app.ledger.store); none changes anything."""

from __future__ import annotations

from collections.abc import Collection, Iterator
from contextlib import AbstractContextManager
from datetime import datetime

from app.core.ledger_errors import NodeNotFound
from app.core.records import (
    EventKind,
    HolderKind,
    Holding,
    LedgerEvent,
    NodeSpec,
    NodeTotals,
    NodeView,
    Placement,
)
from app.ledger.columns import holding_record, resources_of
from app.ledger.paging import HoldingKey, NodeKey, NodeSort, Page
from app.ledger.store import ExclusiveNode, Store


class LedgerQueries:
    def __init__(self, store: Store) -> None:
        self.store = store

    def get_node(self, name: str) -> NodeView:
        with self.store.read() as repo:
            row = repo.find_node(name)
            if row is None:
                raise NodeNotFound(name)
            return repo.view(row)

    def exclusive(self, name: str) -> AbstractContextManager[ExclusiveNode]:
        """The node held against every replica until the block ends (the contract is
        app.db.locks'), and the transactions its holder runs meanwhile."""
        return self.store.exclusive(name)

    def list_nodes(self) -> list[NodeView]:
        with self.store.read() as repo:
            return repo.all_views()

    def views_named(self, names: Collection[str]) -> list[NodeView]:
        """Those of the nodes called ``names`` that exist, by name."""
        with self.store.read() as repo:
            return repo.views_named(names)

    def node_totals(self) -> list[NodeTotals]:
        """Every node with what each kind of holder holds in total (no holdings loaded)."""
        with self.store.read() as repo:
            return repo.all_totals()

    def node_specs(self) -> dict[str, NodeSpec]:
        """Every node's spec by name, without holdings (cheap at 15,000 nodes)."""
        with self.store.read() as repo:
            return repo.all_specs()

    def list_holdings(
        self, node: str | None = None, kind: HolderKind | None = None
    ) -> list[Holding]:
        with self.store.read() as repo:
            if node is not None and repo.find_node(node) is None:
                raise NodeNotFound(node)
            return [holding_record(h, n) for h, n in repo.list_holdings(node, kind)]

    def holdings_of(self, kind: HolderKind, holder_ids: Collection[str]) -> list[Holding]:
        """``kind``'s holdings of these holders, in one read."""
        with self.store.read() as repo:
            return [s.holding for s in repo.holdings_of(kind, list(holder_ids))]

    def held_in_slurm(self) -> list[Holding]:
        """Every holding whose GPU devices a Slurm hold job holds (app.slurm.holds)."""
        with self.store.read() as repo:
            return repo.held_in_slurm()

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
        with self.store.read() as repo:
            for r in repo.placements(kind, created_from, created_before):
                yield r.holder_id, Placement(r.name, resources_of(r), r.created_at)

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
        with self.store.read() as repo:
            return repo.node_views_page(limit, after, name_contains, sort)

    def holdings_page(
        self,
        limit: int,
        *,
        node: str | None = None,
        kind: HolderKind | None = None,
        after: HoldingKey | None = None,
    ) -> Page[Holding, HoldingKey]:
        """One keyset page of list_holdings(node, kind); NodeNotFound for an unknown node."""
        with self.store.read() as repo:
            if node is not None and repo.find_node(node) is None:
                raise NodeNotFound(node)
            return repo.holdings_page(node, kind, limit, after)

    def pending_before(self, cutoff: datetime) -> list[Holding]:
        """Holdings still PENDING that were last touched before ``cutoff``."""
        with self.store.read() as repo:
            return [holding_record(h, n) for h, n in repo.pending_before(cutoff)]

    # the event log

    def last_event_id(self) -> int:
        """Where to start following the event log from now on."""
        with self.store.read() as repo:
            return repo.last_event_id()

    def events(
        self,
        *,
        node: str | None = None,
        kind: EventKind | None = None,
        since: datetime | None = None,
        after_id: int | None = None,
        limit: int = 100,
    ) -> list[LedgerEvent]:
        with self.store.read() as repo:
            return repo.events(node=node, kind=kind, since=since, after_id=after_id, limit=limit)

    def events_after(self, after_id: int, limit: int) -> list[LedgerEvent]:
        """Up to ``limit`` events after ``after_id``, in id order: what the follower of the
        log polls (app.ledger.follow, for the node snapshot), on the hot path."""
        with self.store.read_hot() as repo:
            return repo.events_after(after_id, limit)

    def events_with_ids(self, ids: list[int]) -> list[LedgerEvent]:
        """Those of ``ids`` that are committed now (app.ledger.follow looks for late ones)."""
        with self.store.read() as repo:
            return repo.events_with_ids(ids)
