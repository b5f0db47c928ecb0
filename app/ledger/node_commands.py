"""The nodes' changes (create, update, health, headroom settling, delete), each one
transaction under the node's row lock with its event, as app.ledger.commands' contract
says; the holdings' changes are app.ledger.commands'."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace
from datetime import datetime

from sqlalchemy.exc import IntegrityError

from app.core.headroom import NO_POLICY, HeadroomPolicy, settled_target
from app.core.ledger_errors import CapacityBelowHoldings, NodeInUse, SlurmNameTaken
from app.core.presentation import describe_resources
from app.core.records import NodeHeadroom, NodeSpec, NodeView
from app.core.resources import Resources
from app.ledger import events
from app.ledger.clock import Clock
from app.ledger.columns import assign, node_headroom, spec_values
from app.ledger.store import Store
from app.ledger.tables import NodeRow


class NodeCommands:
    def __init__(self, store: Store, clock: Clock, headroom: HeadroomPolicy = NO_POLICY) -> None:
        self.store = store
        self.clock = clock
        self.headroom = headroom

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
        with self.store.write() as repo:
            row = repo.find_node(name, lock=True)
            target = spec.slurm_name or name
            other = repo.node_mapped_to(target)
            if other is not None and other != name:
                raise SlurmNameTaken(name, target, other)
            if row is None:
                row = NodeRow(name=name, health_reason=health_reason, created_at=now)
                _apply_spec(row, spec, cordon_reason, now)
                repo.add_node(row)
                repo.insert_event(events.node_created(now, name, spec, health_reason))
                repo.session.flush()
                return repo.view(row), True
            view = repo.view(row)
            if not force and not view.held.fits_within(spec.capacity - spec.reserved):
                raise CapacityBelowHoldings(
                    f"node {name!r}: capacity minus reserved would be below what is "
                    f"held ({describe_resources(view.held)}); "
                    "release holdings first or pass force=true"
                )
            before, cordon_before = view.spec, row.cordon_reason
            if before == spec and cordon_before == cordon_reason:
                return view, False  # nothing changes, nothing to record
            _apply_spec(row, spec, cordon_reason, now)
            if before != spec:
                repo.insert_event(events.spec_changed(now, name, before, spec))
            if cordon_before != cordon_reason:
                repo.insert_event(events.cordon_changed(now, name, cordon_before, cordon_reason))
            repo.session.flush()
            return repo.view(row), False

    def set_health(self, name: str, reason: str | None) -> NodeView:
        """Record why an integration (Slurm) makes the node non-admissible (None: healthy)."""
        with self.store.write() as repo:
            row = repo.lock_node(name)
            if row.health_reason != reason:
                now = self.clock()
                repo.insert_event(events.health_changed(now, name, row.health_reason, reason))
                row.health_reason = reason
                row.updated_at = now
            return repo.view(row)

    def settle_headroom(self, contended: Collection[str] = ()) -> list[str]:
        """Apply the headroom's idle time, Slurm's demand and maxima
        (app.core.headroom.settled_target) to every node with a headroom target;
        ``contended``: the Slurm nodes where jobs wait for resources. The nodes whose
        target changed, to push."""
        now = self.clock()

        def settled(row: NodeRow) -> tuple[NodeHeadroom, Resources, bool] | None:
            current = node_headroom(row)
            waited = (row.slurm_name or row.name) in contended
            target = settled_target(row.labels or {}, current, self.headroom, now, contended=waited)
            return None if target == current.target else (current, target, waited)

        # A read first: most steps find nothing to settle and take no write lock.
        with self.store.read() as reader:
            due = {row.name for row in reader.nodes_with_headroom() if settled(row)}
        if not due:
            return []
        changed: list[str] = []
        with self.store.write() as repo:
            for row in repo.nodes_with_headroom(lock=True):
                if row.name in due and (settling := settled(row)) is not None:
                    current, target, waited = settling
                    repo.set_headroom(row.id, replace(current, target=target))
                    repo.insert_event(
                        events.headroom_settled(now, row.name, current, target, waited)
                    )
                    changed.append(row.name)
        return changed

    def delete_node(self, name: str) -> None:
        with self.store.write() as repo:
            row = repo.lock_node(name)
            holdings = repo.holdings_on(row.id)
            if holdings:
                raise NodeInUse(
                    f"node {name!r} still has {len(holdings)} holding(s); release them first"
                )
            repo.delete_node(row)
            repo.insert_event(events.node_deleted(self.clock(), name))


def _apply_spec(row: NodeRow, spec: NodeSpec, cordon_reason: str | None, now: datetime) -> None:
    assign(row, spec_values(spec))
    row.cordon_reason = cordon_reason
    row.updated_at = now
