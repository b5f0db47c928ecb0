"""A cordoned Kubernetes Node drains its Slurm node, an uncordon resumes it: the Slurm
half, the ``DrainPort`` that the Kubernetes side's maintenance reconciler
(app.kube.controllers.maintenance) calls.

Each call reads the node first: the ledger's view of Slurm's state may be a sync step old,
and neither call may act on a state someone else set meanwhile (an administrator's drain
is never resumed, nor replaced by ours). What is left is the moment between that read and
the update, which slurmctld offers no conditional update to close.
"""

from __future__ import annotations

import logging

from app.core.maintenance import resume_refusal
from app.slurm.client import SlurmClient

log = logging.getLogger(__name__)


class SlurmDrains:
    def __init__(self, client: SlurmClient) -> None:
        self.client = client

    def drain(self, node: str, reason: str) -> bool:
        """Drain ``node`` with ``reason`` unless it is drained already; whether it did."""
        if "DRAIN" in self.client.get_node(node).states:
            return False
        self.client.update_node(node, state="DRAIN", reason=reason)
        log.info("Slurm node %s drained: %s", node, reason)
        return True

    def resume(self, node: str) -> bool:
        """Resume ``node`` if it is still drained by the service alone; whether it did."""
        current = self.client.get_node(node)
        if (why := resume_refusal(current.states, current.reason)) is not None:
            log.info("Slurm node %s left as it is at the uncordon: %s", node, why)
            return False
        self.client.update_node(node, state="RESUME")
        log.info("Slurm node %s resumed: its Kubernetes Node was uncordoned", node)
        return True
