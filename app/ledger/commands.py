"""The ledger's changes, each one transaction: lock the node -> read its view -> decide
(app.core.decision for an admission) -> write the change and its event (app.ledger.events).

Concurrency contract (see app.db.engine): every operation that changes a node's holdings
or capacity takes that node's row lock first and decides on the view it reads under the
lock, so concurrent callers, in one process or many, serialize per node. Admission never
leaves holdings above capacity - reserved. Snapshots from Slurm and forced capacity changes
record the truth even when it overcommits a node; such a node admits nothing until it is
back within capacity.

Every change to a node or its holdings appends an event naming the node in the same
transaction: the follower of the log (app.ledger.snapshot, whose subscribers include the
GenericNode mirror) learns of changes, from any replica, only that way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.exc import IntegrityError

from app.core.arithmetic import SnapshotDiff, diff_snapshot
from app.core.decision import Outcome, decide_admission
from app.core.devices import held_devices
from app.core.headroom import released_target
from app.core.ledger_errors import (
    DeviceTaken,
    HolderConflict,
    HoldingNotFound,
    InvalidRequest,
    NodeNotFound,
)
from app.core.pods import resize
from app.core.presentation import describe_resources
from app.core.records import (
    Admission,
    EventKind,
    HeldDevice,
    Holder,
    HolderKind,
    Holding,
    HoldingState,
    NodeHeadroom,
    Recorded,
    Recording,
    Release,
    SnapshotEntry,
)
from app.core.resources import Resources
from app.ledger import events
from app.ledger.columns import (
    StoredHolding,
    assign,
    holding_values,
    resource_values,
    resources_of,
)
from app.ledger.node_commands import NodeCommands
from app.ledger.statements import LedgerStatements
from app.ledger.tables import device_objects

TOUCH_EVERY = timedelta(seconds=1)


class LedgerCommands(NodeCommands):
    """The holdings' changes, and the nodes' (NodeCommands)."""

    def admit(
        self,
        node: str,
        holder: Holder,
        requests: Resources,
        *,
        state: HoldingState = HoldingState.HELD,
        headroom: bool = False,
        devices: Iterable[HeldDevice] = (),
    ) -> Admission:
        """Atomic check-and-hold. Idempotent by holder: the same holder asking the same
        node for the same amounts (and devices) gets its existing holding (created=False).

        ``headroom`` (with ``state`` PENDING, a gate confirms): apply the node's headroom
        (app.core.headroom); an admission inside what Slurm was confirmed to withhold is
        HELD at once, else the node's target is set for the gate's push.

        ``devices``: GPU devices on the node that the holder holds by identity
        (app.core.devices has the rules): InvalidDevices when they cannot be the
        request's GPUs, DeviceTaken when another holding has one. Checked under the same
        row lock as the fit, so of two admissions of one device exactly one gets it. Such
        an admission never skips the gate through the headroom: Slurm must hold the
        devices first. Without devices, nothing of this costs a statement. Their UUIDs are
        kept with the holding and shown, never checked against anything: a retry is the same
        admission whatever its UUIDs; the existing holding, with the UUIDs it has, answers it."""
        named = held_devices(devices)  # rule 1, the part that needs no node
        admission = self._admit(node, holder, requests, state, headroom, named)
        if admission is None:
            # The holding the insert collided with was released meanwhile: once more.
            admission = self._admit(node, holder, requests, state, headroom, named)
        if admission is None:
            raise HolderConflict(f"holder {holder.id!r} is being admitted and released at once")
        return admission

    def _admit(
        self,
        node: str,
        holder: Holder,
        requests: Resources,
        state: HoldingState,
        headroom: bool,
        devices: tuple[HeldDevice, ...],
    ) -> Admission | None:
        now = self.clock()
        with self.store.write_hot() as repo:
            # 1. One read of the node (its devices only when named: the common admission
            # costs no statement for them), 2. one decision on it, 3. write it.
            locked = repo.lock_node_state(node)
            current = locked.totals(repo.held_on(locked.id))
            gated = state is HoldingState.PENDING
            decision = decide_admission(
                current,
                requests,
                # The Kubernetes cap is not the ledger's: the gate applies it to the hold,
                # and the decision keeps the headroom's path within it.
                caps=self.headroom.caps if gated else None,
                gated=gated,
                headroom=self.headroom if headroom and gated else None,
                holder=holder,
                devices=tuple(d.index for d in devices),
                held_devices=repo.devices_on(locked.id) if devices else (),
            )
            if not decision.recorded:
                raise decision.error
            if not decision.refused:
                held = HoldingState.HELD if decision.outcome is Outcome.HELD_NOW else state
                # A holder that holds already (a retry) is found only by the insert that
                # fails: the common case, a new holder, costs no look up front.
                values = holding_values(locked.id, holder, requests, held, now)
                if devices:
                    values["devices"] = device_objects(devices)
                if not repo.insert_new_holding(values):
                    return _existing(repo, holder, node, requests, devices)
                if decision.target is not None:
                    _use_headroom(repo, locked.id, current.headroom, decision.target, now)
                fast = decision.within_headroom
                repo.insert_event(
                    events.admitted(
                        now, node, holder, requests, held, within_headroom=fast, devices=devices
                    )
                )
                holding = Holding(node, holder, requests, held, now, now, devices)
                return Admission(holding, True, refill=decision.refill)
            # A retry of a holder whose own holding fills the node: that holding answers.
            if (existing := repo.holding_of(holder.id, holder.kind)) is not None:
                return Admission(_same_holding(existing, node, requests, devices), False)
            if isinstance(decision.devices, DeviceTaken):
                repo.insert_event(
                    events.device_taken(now, holder, requests, devices, decision.devices)
                )
            else:
                repo.insert_event(events.rejected(now, node, holder, requests, decision.verdict))
        raise decision.error

    def record(
        self,
        node: str,
        holder: Holder,
        requests: Resources,
        *,
        reason: str,
        allocated: Resources | None = None,
    ) -> Admission:
        """Record a holding that already exists outside the ledger (a pod another scheduler
        bound to the node). No fit check: the truth must be in the ledger even when it
        overcommits the node, which then admits nothing until it fits again. ``allocated``:
        what the pod's kubelet allocated to it, if it says (never held less than that).

        The holder's holding on another node is replaced. On the same node (an in-place
        resize) it follows app.core.pods.resize: a shrink at once, a growth only as far as
        the kubelet already allocated it (the rest is Admissions.grow's), where it stands:
        its devices and Slurm hold stay."""
        now = self.clock()
        with self.store.write() as repo:
            locked = repo.lock_node_state(node)
            existing = repo.holding_of(holder.id, holder.kind)
            if existing is not None:
                holding = existing.holding
                if holding.node == node:
                    keep = resize(holding.resources, requests, allocated).now
                    if keep == holding.resources:
                        return Admission(holding, False)
                    resized = repo.resize_holding_returning(existing.id, node, keep, now)
                    repo.insert_event(
                        events.resized(now, node, holder, holding.resources, keep, reason)
                    )
                    return Admission(resized, True)
                repo.delete_holdings([existing.id])
                # The event below names only the new node.
                old = holding.node
                repo.insert_event(
                    events.moved(now, old, node, holding.holder, holding.resources, reason)
                )
            held = HoldingState.HELD
            requests = resize(Resources.ZERO, requests, allocated).target
            repo.insert_holdings([holding_values(locked.id, holder, requests, held, now)])
            repo.insert_event(events.recorded(now, node, holder, requests, reason))
            return Admission(Holding(node, holder, requests, held, now, now), True)

    def resize(self, holder: Holder, grown: Holder, target: Resources, *, reason: str) -> Holding:
        """A pod's growth admitted as holder ``grown`` (Admissions.grow) joins its holding,
        which then holds at least ``target``, in one transaction: what the node withholds
        does not change. HoldingNotFound when either is gone (the pod, or the growth's
        admission undone): nothing changes then."""
        now = self.clock()
        with self.store.write_hot() as repo:
            found, node = repo.lock_holding_of(holder.id, holder.kind)
            part = repo.holding_of(grown.id, grown.kind)
            if part is None or part.node_id != node.id:
                raise HoldingNotFound(grown.id)
            old = found.holding.resources
            new = old + (target - old).at_least_zero()  # the larger of each
            repo.delete_holdings([part.id])
            held = repo.resize_holding_returning(found.id, node.name, new, now)
            repo.insert_event(events.resized(now, node.name, holder, old, new, reason))
            return held

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
                recorded = self.record(
                    entry.node, entry.holder, entry.resources, reason=reason,
                    allocated=entry.allocated,
                )  # fmt: skip
                if recorded.created:
                    changed.add(entry.node)
            except NodeNotFound:
                unknown.append(entry)
        return Recorded(frozenset(changed), tuple(unknown))

    def _record_many(self, entries: Sequence[Recording], reason: str) -> Recorded:
        now = self.clock()
        latest = {(e.holder.kind, e.holder.id): e for e in entries}  # the last entry wins
        with self.store.write_hot() as repo:
            node_ids = repo.lock_nodes([e.node for e in latest.values()])
            existing: dict[tuple[HolderKind, str], StoredHolding] = {}
            for kind in {kind for kind, _ in latest}:
                ids = [holder_id for k, holder_id in latest if k is kind]
                existing.update(
                    ((kind, s.holding.holder.id), s) for s in repo.holdings_of(kind, ids)
                )
            unknown: list[Recording] = []
            stale: list[int] = []
            holdings: list[dict[str, Any]] = []
            written: list[events.EventDraft] = []
            changed: set[str] = set()
            for key, entry in latest.items():
                node_id = node_ids.get(entry.node)
                if node_id is None:
                    unknown.append(entry)
                    continue
                old = existing.get(key)
                if old is not None:
                    was, amounts = old.holding.node, old.holding.resources
                    if was == entry.node:  # resized in place, as record() does
                        keep = resize(amounts, entry.resources, entry.allocated).now
                        if keep != amounts:
                            repo.resize_holding_returning(old.id, was, keep, now)
                            written.append(
                                events.resized(now, was, entry.holder, amounts, keep, reason)
                            )
                            changed.add(was)
                        continue
                    stale.append(old.id)
                    changed.add(was)  # its own event: followers go by node
                    written.append(
                        events.moved(now, was, entry.node, entry.holder, amounts, reason)
                    )
                held = HoldingState.HELD
                amounts = resize(Resources.ZERO, entry.resources, entry.allocated).target
                holdings.append(holding_values(node_id, entry.holder, amounts, held, now))
                written.append(events.recorded(now, entry.node, entry.holder, amounts, reason))
                changed.add(entry.node)
            repo.delete_holdings(stale)
            repo.insert_holdings(holdings)
            repo.insert_events(written)
        return Recorded(frozenset(changed), tuple(unknown))

    def confirm(
        self, kind: HolderKind, holder_id: str, *, slurm_hold: str | None = None
    ) -> Holding:
        """PENDING -> HELD once the external system confirmed the hold. ``slurm_hold``: the
        Slurm job that holds the holding's GPU devices, stored with it (None
        keeps what an earlier confirmation stored)."""
        with self.store.write_hot() as repo:
            found, _ = repo.lock_holding_of(holder_id, kind)
            now = self.clock()
            holding = repo.confirm_holding_returning(found.id, found.holding.node, now, slurm_hold)
            repo.insert_event(events.confirmed(now, holding))
            return holding

    def release(
        self,
        holder_id: str,
        kind: HolderKind | None = None,
        *,
        reason: str = "released",
        into_headroom: bool = False,
    ) -> Release:
        """Remove a pod's or manual holder's holding. Raises HoldingNotFound when there is
        none, so callers that want idempotence treat that as success. ``into_headroom``:
        what a confirmed holding frees stays withheld as the node's headroom while the node
        has one (app.core.headroom.released_target)."""
        if kind is HolderKind.SLURM_JOB:  # only the Slurm sync writes those (replace_holdings)
            raise InvalidRequest("slurm_job holdings are released by the Slurm sync only")
        with self.store.write_hot() as repo:
            found, node = repo.lock_holding_of(holder_id, kind)
            holding = repo.delete_holding_returning(found.id, found.holding.node)
            if holding is None:
                raise HoldingNotFound(holder_id)
            repo.insert_event(events.released(self.clock(), holding, reason))
            # A pending hold's counts may not be Slurm's yet; a holding that moved meanwhile
            # is on a node not locked here: so either is told to Slurm, not kept as headroom.
            if (
                not into_headroom
                or holding.state is not HoldingState.HELD
                or node.id != found.node_id
            ):
                return Release(holding)
            current = node.headroom
            target = released_target(node.spec.labels, current, holding.resources, self.headroom)
            if target != current.target:
                repo.set_headroom(node.id, replace(current, target=target))
            # Withheld = held + target: it fell unless the target took all that was freed.
            return Release(holding, target != current.target + holding.resources)

    def replace_holdings(
        self, node: str, kind: HolderKind, snapshot: Mapping[str, SnapshotEntry]
    ) -> SnapshotDiff:
        """Make ``kind``'s holdings on ``node`` exactly ``snapshot`` in one transaction;
        one event lists the holders that came, went or changed."""
        now = self.clock()
        with self.store.write() as repo:
            row = repo.lock_node(node)
            rows = {h.holder_id: h for h in repo.holdings_on(row.id, kind)}
            diff = diff_snapshot(
                {k: resources_of(h) for k, h in rows.items()},
                {k: e.resources for k, e in snapshot.items()},
            )
            if diff.is_empty:
                return diff
            repo.delete_holdings([rows[holder_id].id for holder_id in diff.removed])
            for holder_id in diff.changed:
                entry = snapshot[holder_id]
                assign(rows[holder_id], resource_values(entry.resources))
                rows[holder_id].display_name = entry.display_name
                rows[holder_id].updated_at = now
            held = HoldingState.HELD
            added = [(Holder(kind, i, snapshot[i].display_name), snapshot[i]) for i in diff.added]
            repo.insert_holdings(
                [holding_values(row.id, h, entry.resources, held, now) for h, entry in added]
            )
            total = Resources.total([e.resources for e in snapshot.values()])
            repo.insert_event(events.holdings_replaced(now, node, kind, diff, total))
            return diff

    def record_event(
        self, kind: EventKind, node: str | None, message: str, details: dict[str, Any] | None = None
    ) -> None:
        """Append an event for something that happened outside the ledger, in its own words
        (a maintenance transition, a hold job lost)."""
        self.append_event(events.noted(self.clock(), kind, node, message, details))

    def append_event(self, draft: events.EventDraft) -> None:
        """Append an event drafted outside the ledger's commands (app.ledger.events: a Slurm
        push's drift, a gate's refusal)."""
        with self.store.write_hot() as repo:
            repo.insert_event(draft)


def _use_headroom(
    repo: LedgerStatements, node_id: int, headroom: NodeHeadroom, target: Resources, now: datetime
) -> None:
    """Record an admission's use of the node's headroom: its target and the time (written at
    most every TOUCH_EVERY for the time alone: idle is counted in minutes)."""
    used = headroom.used_at
    if target != headroom.target or used is None or now - used >= TOUCH_EVERY:
        repo.set_headroom(node_id, replace(headroom, target=target, used_at=now))


def _existing(
    repo: LedgerStatements,
    holder: Holder,
    node: str,
    requests: Resources,
    devices: tuple[HeldDevice, ...],
) -> Admission | None:
    """The holder's holding, that an insert collided with: the answer if it is the same
    request (created=False), else a conflict; None if it went meanwhile."""
    existing = repo.holding_of(holder.id, holder.kind)
    if existing is None:
        return None
    return Admission(_same_holding(existing, node, requests, devices), False)


def _same_holding(
    existing: StoredHolding, node: str, requests: Resources, devices: tuple[HeldDevice, ...]
) -> Holding:
    """The holder's existing holding when it is the same request (the same devices, whatever
    their UUIDs), else a conflict."""
    holding = existing.holding
    indices = tuple(d.index for d in devices)
    if holding.node != node or holding.resources != requests or holding.device_indices != indices:
        held = describe_resources(holding.resources)
        if holding.devices:
            held += f" (GPU devices {', '.join(map(str, holding.device_indices))})"
        raise HolderConflict(
            f"holder {holding.holder.id!r} already holds {held}"
            f" on node {holding.node!r}; release it first"
        )
    return holding
