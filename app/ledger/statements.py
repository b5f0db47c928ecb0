"""The ledger's hot path (admit, release, confirm, bulk recording, the follower's poll):
prebuilt Core statements that run on a bare connection or a Session alike, a fraction of
the ORM's cost per call. Rows in, immutable records out (app.ledger.columns). The ORM
paths write holdings and events through the same methods (app.ledger.repository)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    Connection,
    Table,
    bindparam,
    delete,
    func,
    insert,
    literal_column,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from app.core.ledger_errors import HolderConflict, HoldingNotFound, NodeNotFound
from app.core.records import (
    NO_HEADROOM,
    Holder,
    HolderKind,
    Holding,
    HoldingState,
    LedgerEvent,
    NodeHeadroom,
    NodeView,
)
from app.core.resources import Resources
from app.ledger.columns import (
    HOLDER_KINDS,
    LockedNode,
    StoredHolding,
    event_record,
    event_row,
    headroom_values,
    holding_record,
    locked_node,
    node_record,
    resource_values,
    stored_holding,
)
from app.ledger.events import EventDraft
from app.ledger.tables import EventRow, HoldingRow, NodeRow

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
# A holding's amounts changed where it stands (an in-place resize): its devices, Slurm
# hold and state stay.
_RESIZE_HOLDING = (
    update(HOLDINGS)
    .where(HOLDINGS.c.id == bindparam("holding_id"))
    .values(
        cpu_millis=bindparam("new_cpu_millis"),
        memory_bytes=bindparam("new_memory_bytes"),
        gpus=bindparam("new_gpus"),
        updated_at=bindparam("at"),
    )
    .returning(*HOLDINGS.c)
)
_EVENTS_AFTER = (
    select(EVENTS)
    .where(EVENTS.c.id > bindparam("after_id"))
    .order_by(EVENTS.c.id)
    .limit(bindparam("limit"))
)
# An admission records its use of the headroom.
_SET_HEADROOM = (
    update(NODES)
    .where(NODES.c.id == bindparam("node_id"))
    .values({name: bindparam(f"new_{name}") for name in headroom_values(NO_HEADROOM)})
)


class LedgerStatements:
    """The hot path's SQL, and the one way to write a holding or an event."""

    def __init__(self, session: Connection | Session) -> None:
        self.session = session

    # nodes

    def lock_node_state(self, name: str) -> LockedNode:
        """The node, row-locked until the transaction ends."""
        row = self.session.execute(_LOCK_NODE, {"name": name}).one_or_none()
        if row is None:
            raise NodeNotFound(name)
        return locked_node(row)

    def lock_node_id(self, node_id: int) -> LockedNode:
        """The node by id, row-locked until the transaction ends."""
        return locked_node(self.session.execute(_LOCK_NODE_ID, {"node_id": node_id}).one())

    def lock_nodes(self, names: Sequence[str]) -> dict[str, int]:
        """Name -> id of those of ``names`` that exist, row-locked in name order."""
        rows = self.session.execute(_LOCK_NODES, {"names": sorted(set(names))})
        return {row.name: row.id for row in rows}

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

    def held_on(self, node_id: int) -> dict[HolderKind, Resources]:
        """What each kind of holder holds on the node, summed by the database."""
        rows = self.session.execute(_HELD_ON, {"node_id": node_id})
        return {
            HOLDER_KINDS[kind]: Resources(int(cpu), int(memory), int(gpus))
            for kind, cpu, memory, gpus in rows
        }

    def devices_on(self, node_id: int) -> list[tuple[Holder, tuple[int, ...]]]:
        """The holders on the node that hold GPU devices by identity, with those devices."""
        rows = self.session.execute(_DEVICES_ON, {"node_id": node_id})
        return [
            (Holder(HOLDER_KINDS[kind], holder_id, display), tuple(d["index"] for d in devices))
            for kind, holder_id, display, devices in rows
            if devices
        ]

    # holdings

    def single_node_holdings(self, holder_id: str, kind: HolderKind | None) -> list[StoredHolding]:
        """A pod's or manual holder's holdings."""
        kinds = SINGLE_NODE_KINDS if kind is None else (kind.value,)
        params = {"holder_id": holder_id, "kinds": list(kinds)}
        single = kind is None or kind.value in SINGLE_NODE_KINDS
        rows = self.session.execute(_SINGLE_NODE_HOLDINGS if single else _HOLDER_HOLDINGS, params)
        return [stored_holding(r) for r in rows]

    def holding_of(self, holder_id: str, kind: HolderKind | None) -> StoredHolding | None:
        """The holding this holder already has, or None: the one answer to "does this
        holder hold something already" (a pod or manual holder holds on one node at most).
        Without a kind, an id that both a pod and a manual holder use is a conflict."""
        found = self.single_node_holdings(holder_id, kind)
        if kind is None and len(found) > 1:
            raise HolderConflict(
                f"holder id {holder_id!r} exists as both pod and manual; say which kind"
            )
        return found[0] if found else None

    def lock_holding_of(
        self, holder_id: str, kind: HolderKind | None
    ) -> tuple[StoredHolding, LockedNode]:
        """The holder's holding, re-read under its node's lock, and the node as locked;
        HoldingNotFound if none."""
        found = self.holding_of(holder_id, kind)
        if found is None:
            raise HoldingNotFound(holder_id)
        node = self.lock_node_id(found.node_id)
        locked = self.holding_of(holder_id, found.holding.holder.kind)
        if locked is None:
            raise HoldingNotFound(holder_id)
        return locked, node

    def holdings_of(self, kind: HolderKind, holder_ids: Sequence[str]) -> list[StoredHolding]:
        """``kind``'s holdings of these holders."""
        params = {"kind": kind.value, "holder_ids": list(holder_ids)}
        return [stored_holding(r) for r in self.session.execute(_HOLDINGS_OF, params)]

    def held_in_slurm(self) -> list[Holding]:
        """The holdings a Slurm hold job holds (GPU devices)."""
        return [holding_record(r, r.node_name) for r in self.session.execute(_HELD_IN_SLURM)]

    def insert_holdings(self, values: Sequence[dict[str, Any]]) -> None:
        """New holdings (each from app.ledger.columns.holding_values)."""
        if values:
            self.session.execute(_INSERT_HOLDING, list(values))

    def insert_new_holding(self, values: dict[str, Any]) -> bool:
        """Insert the holding unless its holder holds already; whether it was inserted.
        One statement where a look first would be two: the admission's hot path."""
        bind = self.session.get_bind() if isinstance(self.session, Session) else self.session
        inserted = self.session.execute(_INSERT_NEW_HOLDING[bind.dialect.name], values)
        return inserted.first() is not None

    def delete_holdings(self, ids: Sequence[int]) -> None:
        if ids:
            self.session.execute(_DELETE_HOLDINGS, {"ids": list(ids)})

    def delete_holding_returning(self, holding_id: int, node: str) -> Holding | None:
        """Delete the holding; what it was (on ``node``), or None if it was gone."""
        row = self.session.execute(_DELETE_HOLDING, {"holding_id": holding_id}).one_or_none()
        return None if row is None else holding_record(row, node)

    def confirm_holding_returning(
        self, holding_id: int, node: str, at: datetime, slurm_hold: str | None = None
    ) -> Holding:
        """PENDING -> HELD; ``slurm_hold``: the hold job's id, kept when None."""
        values = {"holding_id": holding_id, "confirmed_at": at, "slurm_hold": slurm_hold}
        return holding_record(self.session.execute(_CONFIRM_HOLDING, values).one(), node)

    def resize_holding_returning(
        self, holding_id: int, node: str, resources: Resources, at: datetime
    ) -> Holding:
        """The holding's amounts set to ``resources``; the holding as it then is."""
        values = {f"new_{k}": v for k, v in resource_values(resources).items()}
        row = self.session.execute(_RESIZE_HOLDING, {"holding_id": holding_id, "at": at, **values})
        return holding_record(row.one(), node)

    # events

    def insert_event(self, draft: EventDraft) -> None:
        """One event, as app.ledger.events drafted it."""
        self.session.execute(_INSERT_EVENT, event_row(draft))

    def insert_events(self, drafts: Sequence[EventDraft]) -> None:
        """Many events in one statement."""
        if drafts:
            self.session.execute(_INSERT_EVENT, [event_row(d) for d in drafts])

    def events_after(self, after_id: int, limit: int) -> list[LedgerEvent]:
        rows = self.session.execute(_EVENTS_AFTER, {"after_id": after_id, "limit": limit})
        return [event_record(r) for r in rows]
