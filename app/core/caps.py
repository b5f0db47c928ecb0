"""How much of a node Kubernetes may hold at most. Pure.

Why a cap: Slurm rejects at submit time any job whose k8scpu/k8smemory request exceeds
every node's CURRENT total, so if Kubernetes may take whole nodes, large Slurm jobs are
refused instead of waiting. A cap keeps part of each node always requestable by Slurm.
Global fractions come from settings; a node's labels can set absolute caps:
``nodeledger.io/kube-max-cpu`` and ``nodeledger.io/kube-max-memory`` (quantities). The
smaller of the two applies. The caps are an input of the admission decision
(app.core.decision, checked in app.core.verdict), applied only with the Slurm integration
on (there is no one to keep a share for otherwise).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from app.core.nodestate import KubeShare
from app.core.presentation import format_cpu, format_memory
from app.core.quantities import QuantityError, Rounding, cpu_millis, memory_bytes
from app.core.resources import Resources

CPU_LABEL = "nodeledger.io/kube-max-cpu"
MEMORY_LABEL = "nodeledger.io/kube-max-memory"


@dataclass(frozen=True, slots=True)
class KubeCaps:
    cpu_fraction: float = 1.0
    memory_fraction: float = 1.0

    def violation(self, node: KubeShare, adding: Resources = Resources.ZERO) -> str | None:
        """Why what Kubernetes holds on ``node`` (plus a pod of ``adding``) is above its
        cap; None when within."""
        held = node.held_by_kubernetes + adding
        try:
            cap = self.caps(node)
        except QuantityError as exc:
            return f"node {node.name} has an invalid Kubernetes cap label: {exc}"
        problems = []
        if held.cpu_millis > cap.cpu_millis:
            problems.append(
                f"cpu: Kubernetes would hold {format_cpu(held.cpu_millis)}, "
                f"cap {format_cpu(cap.cpu_millis)}"
            )
        if held.memory_bytes > cap.memory_bytes:
            problems.append(
                f"memory: Kubernetes would hold {format_memory(held.memory_bytes)}, "
                f"cap {format_memory(cap.memory_bytes)}"
            )
        if not problems:
            return None
        return f"over the Kubernetes share of node {node.name} ({'; '.join(problems)})"

    def room(self, node: KubeShare) -> Resources:
        """The CPU and memory pods may still add on ``node`` under its cap (GPUs are not
        capped); none when a cap label is invalid (``violation`` refuses every pod)."""
        try:
            cap = self.caps(node)
        except QuantityError:
            return Resources(0, 0, node.allocatable.gpus)
        held = node.held_by_kubernetes
        return Resources(
            cap.cpu_millis - held.cpu_millis,
            cap.memory_bytes - held.memory_bytes,
            node.allocatable.gpus,
        ).at_least_zero()

    def caps(self, node: KubeShare) -> Resources:
        """The node's caps (CPU and memory; GPUs are its allocatable's); QuantityError
        for an invalid cap label."""
        allocatable, labels = node.allocatable, node.spec.labels
        return Resources(
            _cap(allocatable.cpu_millis, self.cpu_fraction, labels.get(CPU_LABEL), cpu_millis),
            _cap(
                allocatable.memory_bytes,
                self.memory_fraction,
                labels.get(MEMORY_LABEL),
                memory_bytes,
            ),
            allocatable.gpus,
        )


def _cap(
    allocatable: int, fraction: float, label: str | None, parse: Callable[[str, Rounding], int]
) -> int:
    cap = int(allocatable * fraction)
    if label is not None:
        cap = min(cap, parse(label, Rounding.DOWN))
    return cap
