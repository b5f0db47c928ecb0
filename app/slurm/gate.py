"""Admission confirmed by Slurm (the AdmissionGate the admission service calls).

1. Cap: Kubernetes may hold only its share of the node (app.slurm.policy).
2. Push the lowered counts (the hold is already in the ledger, so the push includes it).
3. Read the node and the jobs back: if Slurm already uses more than the remainder (a job
   started between the ledger check and the push), reject naming the jobs; the admission service
   then undoes the hold and calls ``changed``, which raises the counts again.
Once the lowered counts are in slurmctld, no later job can start on what they withhold,
so a hold that passes step 3 is safe.

Slurm unreachable or refusing the token: reject with that reason (fail closed) unless
``fail_open``, in which case the sync pushes the counts when Slurm is back.
"""

from __future__ import annotations

import logging

from app.ledger.errors import AdmissionRejected
from app.ledger.records import Holding, NodeView
from app.slurm.client import SlurmClient
from app.slurm.counts import slurm_overlap, slurm_usage
from app.slurm.errors import SlurmError
from app.slurm.models import SlurmJob
from app.slurm.policy import KubeCaps
from app.slurm.push import Pusher

log = logging.getLogger(__name__)


class SlurmGate:
    def __init__(
        self, client: SlurmClient, pusher: Pusher, caps: KubeCaps, *, fail_open: bool = False
    ) -> None:
        self.client = client
        self.pusher = pusher
        self.caps = caps
        self.fail_open = fail_open

    def confirm(self, node: NodeView, holding: Holding) -> None:
        if (violation := self.caps.violation(node)) is not None:
            raise AdmissionRejected(violation)
        try:
            result = self.pusher.push(node.name, reason=f"admitting {holding.holder.display_name}")
            # Jobs read after the push: any job that started before the lowered counts
            # landed is in this list.
            listing = self.client.get_jobs()
            jobs = listing.items if listing else ()
            used = slurm_usage(result.node, jobs)
            problems = slurm_overlap(result.node, used, result.withheld)
        except SlurmError as exc:
            if self.fail_open:
                log.warning("admitting on %s without Slurm's confirmation: %s", node.name, exc)
                return
            raise AdmissionRejected(f"Slurm cannot confirm the admission: {exc.message}") from exc
        if problems:
            raise AdmissionRejected(
                f"Slurm already holds it on node {result.node.name}: {'; '.join(problems)}"
                f"{_jobs_on(result.node.name, jobs)}"
            )

    def changed(self, node: str) -> None:
        self.pusher.push(node, reason="holdings changed")


def _jobs_on(slurm_node: str, jobs: tuple[SlurmJob, ...]) -> str:
    names = [
        f"{job.job_id} ({job.name})"
        for job in jobs
        if job.holds_resources and any(a.node == slurm_node for a in job.allocations)
    ]
    return f" (jobs {', '.join(names)})" if names else ""
