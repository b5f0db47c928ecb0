"""The hint queue: slurmctld's PrologSlurmctld and EpilogSlurmctld (slurm-plugins/hooks/
nodeledger-job-hint) say "job N started, ended or was requeued", and its node_features plugin
(slurm-plugins/node_features/k8s_resources) "node N was drained, resumed, set DOWN...", so the
sync reads that one job or node instead of waiting for a full listing (tens of seconds at
15,000 nodes).

Why the database: the Kubernetes Service hands a hint to any replica, but only the replica
holding the ``slurm-sync`` leadership writes the ledger. A hint stored in a table reaches
whichever replica leads now, or next after a failover, with no way needed to address the
leader and no writes from a standby; it costs one INSERT per request and, on the leader, one
short query per poll. The receiving replica also wakes its own sync loop, so on the leader
(and on a single replica) a hint is applied at once; from a standby it waits for the
leader's next poll (``HINT_POLL`` in app.slurm.sync).

Bounded: the leader takes at most ``MAX_TAKEN`` hints of each kind at once; more mean a
flood, which collapses into "do a full pass" (the table is emptied), as does a node hint
"*" (more nodes changed at once than the plugin names). A hint is only ever a reason to
read Slurm again, never data: a lost or repeated one costs freshness, not correctness,
and the sync's full listing repairs whatever a lost one left.

The plugin also posts a node hint naming no node about once a minute when nothing changed
(its heartbeat, stored as ``WATCHER_ALIVE``): the leader can then tell a watcher that
stopped, or hints that fail, from a quiet cluster (app.slurm.hint_sync).

Bounded for the caller too (anyone allowed ``create jobhints``): an "every node" hint while
one is still pending writes nothing, since the full listing that one brings begins after it
is taken, so after this post; and beyond ``rate`` posts a second (a burst of
``BURST_SECONDS`` of them) on this replica a post is refused with ``HintsLimited`` (429)
and covered the same way, by one pending "every node" hint. A flood of posts thus costs
one full listing and at most one write per listing, and no hint it carried is lost.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Collection
from typing import Any

from sqlalchemy import delete, insert, select
from sqlalchemy.orm import InstrumentedAttribute

from app.core.errors import NodeledgerError
from app.core.rate import TokenBucket
from app.db.engine import Database
from app.ledger.tables import SlurmJobHintRow, SlurmNodeHintRow

MAX_TAKEN = 10_000  # job ids (or node names) taken at once; beyond: a full pass instead
EVERY_NODE = "*"
WATCHER_ALIVE = ""  # the heartbeat's row: no Slurm node has an empty name
RATE = 200.0  # hint posts a second one replica stores as they are
BURST_SECONDS = 5  # how many seconds of RATE may come at once (a job array starting)


class HintsLimited(NodeledgerError):
    """More hint posts than this replica stores one by one: this one is covered by a full
    listing instead, retry no sooner than ``retry_after`` seconds."""

    code = "too_many_hints"
    http_status = 429
    retryable = True

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class HintQueue:
    def __init__(
        self, db: Database, *, rate: float = RATE, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self.db = db
        self._wake: Callable[[], None] = lambda: None
        self._bucket = TokenBucket(rate, max(1, math.ceil(rate * BURST_SECONDS)), monotonic)
        self._bucket_lock = threading.Lock()  # posts arrive on the server's thread pool

    def on_hint(self, wake: Callable[[], None]) -> None:
        """Call ``wake`` after each hint this replica stores (the sync loop's wake-up)."""
        self._wake = wake

    def post(self, job_ids: Collection[int]) -> None:
        """Job ids that started, ended or were requeued; HintsLimited beyond the rate."""
        self._within_rate()
        with self.db.write_statements() as connection:
            connection.execute(insert(SlurmJobHintRow), [{"job_id": j} for j in set(job_ids)])
        self._wake()

    def post_nodes(self, names: Collection[str]) -> None:
        """Node names (``EVERY_NODE``: every node) whose state slurmctld saw change; none:
        the plugin's heartbeat. HintsLimited beyond the rate."""
        self._within_rate()
        if EVERY_NODE in names:
            self._every_node()
            return
        rows = [{"node": n} for n in set(names)] or [{"node": WATCHER_ALIVE}]
        with self.db.write_statements() as connection:
            connection.execute(insert(SlurmNodeHintRow), rows)
        self._wake()

    def _within_rate(self) -> None:
        """Pass within the rate; beyond it, cover the post by a full listing and refuse."""
        with self._bucket_lock:
            wait = self._bucket.wait_time()
        if wait > 0:
            self._every_node()
            raise HintsLimited(
                f"more than {self._bucket.rate:g} Slurm hints a second reached this replica: "
                "a full listing covers this one",
                max(1, math.ceil(wait)),
            )

    def _every_node(self) -> None:
        """An ``EVERY_NODE`` hint, unless one is pending: the full listing it brings begins
        once it is taken, after this call, so it covers this hint too."""
        pending = select(SlurmNodeHintRow.id).where(SlurmNodeHintRow.node == EVERY_NODE).limit(1)
        with self.db.read_statements() as connection:  # no write lock for that
            missing = connection.execute(pending).first() is None
        if missing:  # two posts may both write one: the take removes every row it read
            with self.db.write_statements() as connection:
                connection.execute(insert(SlurmNodeHintRow), [{"node": EVERY_NODE}])
        self._wake()

    def take(self) -> set[str] | None:
        """The job ids hinted since the last take (removed from the table); None when there
        were more than ``MAX_TAKEN``: every one is dropped, do a full pass instead."""
        taken = self._take(SlurmJobHintRow, SlurmJobHintRow.job_id)
        return None if taken is None else {str(j) for j in taken}

    def take_nodes(self) -> set[str] | None:
        """The Slurm nodes hinted since the last take (``WATCHER_ALIVE`` among them after a
        heartbeat); None for a flood or ``EVERY_NODE``: a full listing instead."""
        taken = self._take(SlurmNodeHintRow, SlurmNodeHintRow.node)
        return None if taken is None or EVERY_NODE in taken else {str(n) for n in taken}

    def _take(
        self,
        table: type[SlurmJobHintRow] | type[SlurmNodeHintRow],
        column: InstrumentedAttribute[Any],
    ) -> list[Any] | None:
        query = select(table.id, column).order_by(table.id).limit(MAX_TAKEN + 1)
        with self.db.read_statements() as connection:  # mostly empty: no write lock for that
            rows = connection.execute(query).all()
        if not rows:
            return []
        flood = len(rows) > MAX_TAKEN
        with self.db.write_statements() as connection:
            # Exactly the rows read: on PostgreSQL a lower id may commit after a higher one.
            read = [row[0] for row in rows]
            everything = delete(table)
            connection.execute(everything if flood else everything.where(table.id.in_(read)))
        return None if flood else [row[1] for row in rows]
