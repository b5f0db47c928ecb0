"""Every node view in memory, kept current from the ledger's event log: the one read
model, and the process's only follower of the log.

Why: the extender's filter and prioritize (a thousand candidates a call), the Slurm sync,
the GenericNode mirror and the metrics (with an integration on) read many nodes, often;
reading every view from the database costs seconds at 15,000 nodes and 150,000 holdings.
Here every view is read once, and then only the nodes that changed. Those that act on
changes (the mirror) subscribe: they are told the names of the nodes that changed, and
read their views here.

How: a full load starts an EventFollower (app.ledger.follow) at the end of the log, then
reads every node and every holding (two queries). A refresh polls the follower and reads
again only the nodes its events name (two queries per 500 names); a node gone from the
database leaves the snapshot. Every ledger change records an event naming its node
in the same transaction (app.ledger.commands), on whichever replica made it.

Contract:
- Freshness: ``views(max_age)`` answers from a refresh that started at most ``max_age``
  seconds before the call, refreshing first when the last one is older, or when this
  process committed a write since (its own writes are seen, unless the caller passes
  ``own_writes=False``: the extender's filter, whose ``max_staleness`` covers this
  replica's binds too). With 0 (the default of the extender, and what the Slurm sync and
  the Kubernetes controllers ask for) a caller sees every change committed before its
  call, on any replica, like a read of the ledger would; that costs one indexed read of
  the event log when nothing changed (on PostgreSQL a round trip: the extender's
  ``max_staleness`` trades it for up to that many seconds of changes). ``latest()``
  never refreshes. Refreshes run one at a time, and a caller that waited for one that
  started after it asked takes its result.
- Readers get an immutable mapping that a refresh replaces whole: never a half-applied
  refresh, and a reader never holds up the next refresh. (The mapping is the views of the
  last full load plus the nodes changed since, so that a refresh copies what changed
  since the load, not every view.)
- Bounded error: PostgreSQL commits events out of id order, and the follower looks for a
  late one for 30 s (its patience). If it gives up on an id that commits later still, or
  if anything changed a node without an event, a full reload repairs the views: soon after
  a give-up, and every ``full_reload_every`` seconds (300) regardless. It runs in the
  background and is swapped in when done; refreshes go on meanwhile.
- A refresh that fails (database down) raises to its caller, and the next one loads
  everything again: the events the failed one consumed are not lost.
- Subscribers (``subscribe``) are called with the names of the nodes that changed (new,
  changed or gone) after every refresh or reload that changed any, once ``views()``
  returns the new views; after a full load, with every name whose view differs from the
  last ones published (every name, the first time). A callback runs on the thread that
  refreshed, while the next refresh waits: it should only note the names. Subscribing
  and unsubscribing are thread-safe; a callback that raises is logged and skipped.
- The extender only advises the scheduler (bind admits through the ledger, atomically):
  a stale view costs a failed bind at worst, never an oversubscribed node.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar, overload

from app.core.components import Health
from app.core.records import EventKind, NodeView
from app.ledger.follow import EventFollower
from app.ledger.service import Ledger
from app.loops import Loop
from app.outages import log_failure

log = logging.getLogger(__name__)

T = TypeVar("T")
ChangedNodes = Callable[[frozenset[str]], None]
_ABSENT: Any = object()
COMPACT_AFTER = 256  # changed views kept beside the base at least (at most an eighth of it)
# Events that record something about a node without changing it.
UNCHANGING = frozenset({EventKind.REJECTED, EventKind.SLURM_PUSHED, EventKind.SLURM_DRIFT})


class NodeViews(Protocol):
    """Every node view, by name: the Ledger reads them, the NodeSnapshot has them (and hands
    out the same sequence for as long as no node changed)."""

    def list_nodes(self) -> Sequence[NodeView]: ...


class Views(Mapping[str, NodeView]):
    """Immutable: a full load's views (``base``) with the nodes changed since (None: gone)."""

    __slots__ = ("_base", "_changed", "_len", "_sorted")

    def __init__(
        self, base: dict[str, NodeView], changed: dict[str, NodeView | None] | None = None
    ) -> None:
        self._base = base
        self._changed = changed or {}
        added = sum(1 for n, v in self._changed.items() if v is not None and n not in base)
        gone = sum(1 for n, v in self._changed.items() if v is None and n in base)
        self._len = len(base) + added - gone
        self._sorted: tuple[NodeView, ...] | None = None

    def by_name(self) -> tuple[NodeView, ...]:
        """Every view, sorted by name; sorted once (15,000 views: ~25 ms)."""
        if self._sorted is None:
            self._sorted = tuple(sorted(self.values(), key=lambda v: v.name))
        return self._sorted

    def __getitem__(self, name: str) -> NodeView:
        if name in self._changed:
            view = self._changed[name]
            if view is None:
                raise KeyError(name)
            return view
        return self._base[name]

    @overload
    def get(self, name: str, /) -> NodeView | None: ...

    @overload
    def get(self, name: str, /, default: NodeView | T) -> NodeView | T: ...

    def get(self, name: str, /, default: NodeView | T | None = None) -> NodeView | T | None:
        # Mapping's get goes through __getitem__ and KeyError: a third of a filter's time.
        view = self._changed.get(name, _ABSENT)
        if view is _ABSENT:
            return self._base.get(name, default)
        return default if view is None else view

    def __iter__(self) -> Iterator[str]:
        yield from (n for n in self._base if n not in self._changed)
        yield from (n for n, v in self._changed.items() if v is not None)

    def __len__(self) -> int:
        return self._len

    def with_changes(self, changes: Mapping[str, NodeView | None]) -> Views:
        changed = {**self._changed, **changes}
        if len(changed) <= max(COMPACT_AFTER, len(self._base) // 8):
            return Views(self._base, changed)
        # Folded into a new base once in a while: lookups stay two dict reads at most.
        base = {n: v for n, v in self._base.items() if n not in changed}
        base.update((n, v) for n, v in changed.items() if v is not None)
        return Views(base)


@dataclass(frozen=True, slots=True)
class _Loaded:
    views: Views
    follower: EventFollower
    started: float  # when the full load started (monotonic)


class NodeSnapshot:
    """The component: loads at start, then refreshes every ``interval`` seconds in the
    background (so that callers' own refreshes find little to do) and reloads fully when
    due. Reads work without start() too: the first one loads."""

    name = "snapshot"

    def __init__(
        self,
        ledger: Ledger,
        *,
        interval: float = 1.0,
        full_reload_every: float = 300.0,
        patience: float = 30.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ledger = ledger
        self.interval = interval
        self.full_reload_every = full_reload_every
        self.patience = patience
        self.monotonic = monotonic
        self._loaded: _Loaded | None = None
        self._refreshed = -math.inf  # when the refresh behind the current views started
        self._refreshing = threading.Lock()
        self._reloading = threading.Lock()  # one full load at a time
        self._error: str | None = None
        self._written = False  # this process committed a write since the last refresh
        self._loop = Loop(
            "node-snapshot",
            self._keep_fresh,
            interval=interval,
            logger=log,
            what="node snapshot",
            wait_first=True,  # start() has just loaded
        )
        self._subscribers: tuple[ChangedNodes, ...] = ()  # replaced whole: read without a lock
        self._subscribing = threading.Lock()
        self._published: Views | None = None  # the views subscribers were last told about
        ledger.db.on_commit(self._on_commit)

    # reads

    def views(self, max_age: float = 0.0, *, own_writes: bool = True) -> Views:
        """Every node's view by name, from a refresh that started at most ``max_age``
        seconds ago; with ``own_writes`` False, this process's writes since may be missed
        for as long too (as the extender allows: during a burst of binds it commits
        between every two filters, and each would refresh)."""
        asked = self.monotonic()
        if self._stale(asked, max_age, own_writes):
            with self._refreshing:
                if self._stale(asked, max_age, own_writes):
                    self._refresh()
        loaded = self._loaded
        assert loaded is not None
        return loaded.views

    def latest(self) -> Views:
        """The last refresh's views, without a refresh (the first read loads): for advice
        that is checked again before anything is written (the extender's prioritize), at
        most the background refresh's interval behind, plus this process's writes since."""
        loaded = self._loaded
        return loaded.views if loaded is not None else self.views()

    def list_nodes(self) -> tuple[NodeView, ...]:
        """NodeViews: every view, fresh, by name (as Ledger.list_nodes); the same tuple
        while no node changed."""
        return self.views().by_name()

    # subscriptions

    def subscribe(self, callback: ChangedNodes) -> Callable[[], None]:
        """Call ``callback(names)`` whenever nodes change (see the module's contract);
        returns what ends the subscription."""
        with self._subscribing:
            self._subscribers = (*self._subscribers, callback)

        def unsubscribe() -> None:
            with self._subscribing:
                self._subscribers = tuple(c for c in self._subscribers if c is not callback)

        return unsubscribe

    def _publish(self, views: Views, names: Collection[str] | None = None) -> None:
        """Tell the subscribers which nodes changed: ``names``, or after a full load those
        whose view differs from the views last published. The caller holds ``_refreshing``."""
        before, self._published = self._published, views
        subscribers = self._subscribers
        if not subscribers:
            return
        if names is None:
            names = _differing(before, views)
        if not names:
            return
        changed = frozenset(names)
        for callback in subscribers:
            try:
                callback(changed)
            except Exception:
                log.exception("a subscriber of the node snapshot failed")

    def _stale(self, asked: float, max_age: float, own_writes: bool = True) -> bool:
        written = self._written and own_writes
        return self._loaded is None or written or self._refreshed < asked - max_age

    # updates

    def _on_commit(self) -> None:
        self._written = True

    def refresh(self) -> None:
        with self._refreshing:
            self._refresh()

    def reload(self) -> None:
        """Read every node again, and swap the result in once it is complete."""
        with self._reloading:
            loaded = self._load()
            with self._refreshing:
                self._loaded = loaded
                self._publish(loaded.views)
                # Older than the refresh before, maybe: the new views are as of their start,
                # so the next read polls their follower (this process's commits included).
                self._refreshed = loaded.started
                self._written = True

    def _load(self) -> _Loaded:
        started = self.monotonic()
        # Follower first: whatever commits while the views are read shows up in its events.
        follower = EventFollower(self.ledger, patience=self.patience, monotonic=self.monotonic)
        follower.start()
        views = Views({v.name: v for v in self.ledger.list_nodes()})
        return _Loaded(views, follower, started)

    def _refresh(self) -> None:
        """Apply what changed since the last refresh; the caller holds ``_refreshing``."""
        started = self.monotonic()
        self._written = False  # before reading: a commit from now on is read next time
        loaded = self._loaded
        try:
            if loaded is None:
                self._loaded = loaded = self._load()
                self._publish(loaded.views)
            else:
                events = loaded.follower.poll()
                names = {e.node for e in events if e.node is not None and e.kind not in UNCHANGING}
                if names:
                    self._loaded = loaded = self._with_nodes(loaded, names)
                    self._publish(loaded.views, names)
        except Exception as exc:
            self._loaded = None  # the polled events are gone: load everything next time
            self._error = f"refreshing the node snapshot failed: {exc}"
            raise
        self._refreshed = started
        self._error = None

    def _with_nodes(self, loaded: _Loaded, names: set[str]) -> _Loaded:
        fresh = {v.name: v for v in self.ledger.views_named(names)}
        # A node missing from the database was deleted: None takes it out.
        changes = {name: fresh.get(name) for name in names}
        return replace(loaded, views=loaded.views.with_changes(changes))

    # Component

    def start(self) -> None:
        try:
            self.reload()
        except Exception as exc:  # the database may come later; the first read loads then
            log_failure(log, "loading the node snapshot", exc)
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop(timeout=30)

    def health(self) -> Health:
        if self._error is not None:
            return Health("degraded", self._error)
        loaded = self._loaded
        if loaded is None:
            return Health("degraded", "not loaded yet")
        age = self.monotonic() - self._refreshed
        return Health("ok", f"{len(loaded.views)} nodes, refreshed {age:.1f}s ago")

    def _keep_fresh(self) -> None:
        """The loop's step: reload when due (or the follower gave up), else refresh."""
        try:
            loaded = self._loaded
            if (
                loaded is None
                or loaded.follower.given_up
                or self.monotonic() - loaded.started > self.full_reload_every
            ):
                self.reload()
            else:
                self.views(max_age=self.interval)
        except Exception as exc:  # the next round tries again; health() says why
            self._error = f"refreshing the node snapshot failed: {exc}"
            raise


def _differing(before: Views | None, after: Views) -> set[str]:
    """The names of the nodes whose views differ between two full sets of views."""
    if before is None:
        return set(after)
    names = {name for name, view in after.items() if before.get(name) != view}
    names.update(name for name in before if name not in after)
    return names
