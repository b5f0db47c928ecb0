"""Admission confirmed by Slurm (the AdmissionGate the admission service calls).

1. Cap: Kubernetes may hold only its share of the node (app.slurm.policy).
2. Push the lowered counts (the hold is already in the ledger, so the push includes it).
3. Read the node back: if Slurm already uses more than the remainder (a job started
   between the ledger check and the push), reject naming the jobs; the admission service
   then undoes the hold and calls ``released``, which raises the counts again.
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
from app.slurm.counts import slurm_overlap
from app.slurm.errors import SlurmError
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
            problems = slurm_overlap(result.node, result.withheld)
            if problems:
                raise AdmissionRejected(
                    f"Slurm already holds it on node {result.node.name}: {'; '.join(problems)}"
                    f"{self._jobs_on(result.node.name)}"
                )
        except SlurmError as exc:
            if self.fail_open:
                log.warning("admitting on %s without Slurm's confirmation: %s", node.name, exc)
                return
            raise AdmissionRejected(f"Slurm cannot confirm the admission: {exc.message}") from exc

    def released(self, node: str) -> None:
        self.pusher.push(node, reason="released")

    def _jobs_on(self, slurm_node: str) -> str:
        try:
            listing = self.client.get_jobs()
        except SlurmError:
            return ""
        jobs = [
            f"{job.job_id} ({job.name})"
            for job in (listing.items if listing else ())
            if job.holds_resources and any(a.node == slurm_node for a in job.allocations)
        ]
        return f" (jobs {', '.join(jobs)})" if jobs else ""
