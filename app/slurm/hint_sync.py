"""Hints applied: each hinted job read from Slurm, moved in the cache, its nodes synced; each
hinted node (a state change: drained, resumed, DOWN...) read afresh and synced.

slurmctld's PrologSlurmctld/EpilogSlurmctld name a job that started, ended or was requeued
(app.slurm.hint_queue); the leader reads that one job (``GET job/{id}``), moves it in the cache
(app.slurm.state) and syncs only the nodes it was on or is on now, each read afresh
(``GET node/{name}``: states and ``gres_used`` are live there). Jobs seen COMPLETING still
hold their nodes and are read again every time until they let go, so an Epilog hint that
arrives while the job is COMPLETING still releases it. A job whose read failed is read
again next time; beyond MAX_REREADS of them, or a flood of hints, a full listing instead.

Node hints also say that slurmctld's node watcher runs: it posts at least every minute (a
heartbeat naming no node), so ``quiet_for`` growing past STALE_NODE_HINTS means it stopped
or its posts fail (the sync's health and ``nodeledger_slurm_node_hint_age_seconds``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from app.core.errors import NodeledgerError
from app.slurm.client import SlurmClient
from app.slurm.errors import SlurmError
from app.slurm.hint_queue import WATCHER_ALIVE, HintQueue
from app.slurm.reconcile import NodeReconciler
from app.slurm.state import SlurmState

log = logging.getLogger("app.slurm.sync")  # the sync's lines, under the name they always had

SLOW_HINTS = 0.5  # seconds: applying hints slower than this is logged as a warning
MAX_REREADS = 10_000  # hinted jobs whose read failed, kept to read again; beyond: full pass
# Seconds without a node hint after which node hints are called stale: three of the
# plugin's heartbeats (HEARTBEAT_MS in slurm-plugins/node_features/k8s_resources).
STALE_NODE_HINTS = 180.0


class HintSync:
    def __init__(
        self,
        client: SlurmClient,
        hints: HintQueue,
        state: SlurmState,
        reconciler: NodeReconciler,
        *,
        full_listing: Callable[[], None],
        monotonic: Callable[[], float] = time.monotonic,
        heard: Callable[[], None] = lambda: None,
    ) -> None:
        """``full_listing``: make the next listing a full one (app.slurm.listings);
        ``heard``: called when a node hint (the watcher's heartbeat too) arrives."""
        self.client = client
        self.hints = hints
        self.state = state
        self.reconciler = reconciler
        self.full_listing = full_listing
        self.monotonic = monotonic
        self._rereads: set[str] = set()  # hinted jobs whose read failed
        self._node_hint_at: float | None = None  # monotonic; None: none taken yet
        self.heard = heard

    def quiet_for(self) -> float | None:
        """Seconds since this replica last took a node hint; None if it never took one (a
        site without the node_features plugin, or a leader that has not yet heard it)."""
        return None if self._node_hint_at is None else self.monotonic() - self._node_hint_at

    def apply(self) -> list[str]:
        """Read each hinted job, each job seen COMPLETING and each whose read failed before,
        move it in the cache, and sync the nodes it was on or is on now. Failures, by node
        or job (a job whose read failed is read again next time)."""
        taken = self.hints.take()
        if taken is None:
            log.warning("a flood of Slurm job hints: a full listing instead")
            self.full_listing()
            taken = set()
        nodes = self.hints.take_nodes()
        if nodes is None or nodes:
            self._node_hint_at = self.monotonic()
            self.heard()
        if nodes is None:
            log.info("Slurm hinted every node: a full listing instead")
            self.full_listing()
            nodes = set()
        nodes.discard(WATCHER_ALIVE)
        failures: list[str] = []
        touched: set[str] = set()
        due = sorted(taken | self.state.completing() | self._rereads, key=lambda i: (len(i), i))
        if not due and not nodes:
            return []
        started = self.monotonic()
        for n, job_id in enumerate(due):
            began = self.monotonic()
            try:
                job = self.client.get_job(job_id)
            except SlurmError as exc:
                failures.append(f"job {job_id}: {exc}")
                self._rereads.update(due[n:])  # Slurm away: every one of them again later
                if len(self._rereads) > MAX_REREADS:
                    self.full_listing()
                    self._rereads.clear()
                break
            self._rereads.discard(job_id)
            touched |= self.state.put_hinted(
                job_id, job if job is not None and job.holds_resources else None, began
            )
        self.state.publish()
        read = self.monotonic()
        for slurm_name in sorted(touched | nodes):
            try:
                self.reconciler.sync_slurm_node(slurm_name, self.monotonic())
            except NodeledgerError as exc:
                failures.append(f"{slurm_name}: {exc}")
        self.state.publish()
        done = self.monotonic()
        # Hints exist to be applied within a fraction of a second: say when they were not.
        log.log(
            logging.WARNING if done - started > SLOW_HINTS else logging.DEBUG,
            "Slurm hints: read %d jobs in %.3fs, synced %d nodes in %.3fs (hinted: %s; %s)",
            len(due),
            read - started,
            len(touched | nodes),
            done - read,
            ", ".join(sorted(taken, key=lambda i: (len(i), i))[:10]) or "no job",
            ", ".join(sorted(nodes)[:10]) or "no node",
        )
        return failures
