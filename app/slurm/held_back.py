"""Jobs slurmctld held back because of what Kubernetes held: nudged, so that slurmctld
evaluates them again, once a count rises.

A queued job that asks for more k8scpu/k8smemory/k8sgpu than any node it may run on has
*in total* right now (the ledger lowered those totals for pods, or withholds every GPU of
a node whose GPU pods lost their holds) is marked non-runnable by slurmctld: PENDING,
Reason=BadConstraints, priority 0 (24.11 and 26.05.3). slurmctld looks at such a job again
only when node features change (job_mgr.c: "Features have been changed on some node, make
job eligible to run and test to see if it can run now") or when the job is updated, not
when the totals come back (a job stayed held 280 s after an ``scontrol update`` raised
them; a node update through slurmrestd makes it look again only sometimes: three jobs
stayed held after the GPUs of a resumed node came back, 24.11).
The k8s totals are node features in all but name, so the leader does what slurmctld does
for features: once a node's k8s total rose, each such job gets an empty update (a nudge)
and slurmctld evaluates it again; one that still cannot run is marked again at its next
scheduling pass. Each job is nudged at most once per rise (and once when first seen), so a
job that can never run costs one update per rise, not one per step.
"""

from __future__ import annotations

import logging
from collections.abc import Collection

from app.core.counts import K8sCounts, current_counts
from app.core.slurm_models import SlurmNode
from app.slurm.client import SlurmClient, job_gone
from app.slurm.errors import SlurmError, SlurmRequestError

log = logging.getLogger(__name__)


def _rose(before: K8sCounts | None, now: K8sCounts) -> bool:
    if before is None:  # a node new to the listing: more totals than before
        return True
    return (
        now.k8scpu > before.k8scpu
        or now.k8smemory > before.k8smemory
        or (now.k8sgpu or 0) > (before.k8sgpu or 0)
    )


class HeldBackJobs:
    """The leader's: which held-back jobs to nudge, and the nudges (empty job updates)."""

    def __init__(self, client: SlurmClient) -> None:
        self.client = client
        # Every node's k8s totals at the last look; None while no job is held back.
        self._totals: dict[str, K8sCounts] | None = None
        self._rises = 0
        self._updated: dict[str, int] = {}  # job id -> the rise it was last updated after

    def nudge(self, nodes: Collection[SlurmNode], held_back: Collection[str]) -> list[str]:
        """Nudge each held-back job not nudged since the last rise; failures, by job.

        A nudge changes nothing of the job (it releases no hold); it only makes slurmctld
        evaluate the job again."""
        if not held_back:
            self._totals, self._updated = None, {}
            return []
        totals = {node.name: current_counts(node) for node in nodes}
        if self._totals is None or any(
            _rose(self._totals.get(name), now) for name, now in totals.items()
        ):
            self._rises += 1
        self._totals = totals
        self._updated = {j: r for j, r in self._updated.items() if j in held_back}
        failures = []
        for job_id in held_back:
            if self._updated.get(job_id, -1) >= self._rises:
                continue
            try:
                self.client.update_job(job_id, {})
            except SlurmRequestError as exc:
                if not job_gone(exc):  # e.g. a token whose user may not update others' jobs
                    failures.append(f"job {job_id}: {exc}")
                    continue
                log.debug("held-back job %s ended meanwhile: %s", job_id, exc)
            except SlurmError as exc:
                failures.append(f"job {job_id}: {exc}")
                continue
            else:
                log.info(
                    "job %s was held back (BadConstraints) asking for k8s GRES: updated, so "
                    "that slurmctld evaluates it against the counts as they are now",
                    job_id,
                )
            self._updated[job_id] = self._rises
        return failures
