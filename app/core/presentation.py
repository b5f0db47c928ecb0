"""How amounts and shortfalls read to people: in error messages, events and API bodies.

Pure and dependency-free (base units in, Kubernetes notation out), so that the ledger, the
HTTP schemas and the scheduler extender use the same words without importing each other.
"""

from __future__ import annotations

from collections.abc import Callable

from app.core.arithmetic import Shortfall
from app.core.resources import ResourceName, Resources

_BINARY_SUFFIXES = ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki")


def format_cpu(millis: int) -> str:
    """Millicores in Kubernetes notation: "2", "1500m", "-250m"."""
    if millis % 1000 == 0:
        return str(millis // 1000)
    return f"{millis}m"


def format_memory(num_bytes: int) -> str:
    """Bytes with the largest binary suffix that divides them exactly: "4Gi", "1536Mi"."""
    if num_bytes == 0:
        return "0"
    magnitude = abs(num_bytes)
    for power, suffix in zip(range(6, 0, -1), _BINARY_SUFFIXES, strict=True):
        unit = 1024**power
        if magnitude % unit == 0:
            return f"{num_bytes // unit}{suffix}"
    return str(num_bytes)


_FORMATS: dict[ResourceName, Callable[[int], str]] = {
    "cpu": format_cpu,
    "memory": format_memory,
    "gpu": str,
}


def format_amount(resource: ResourceName, amount: int) -> str:
    return _FORMATS[resource](amount)


def describe_resources(resources: Resources) -> str:
    """ "1500m cpu, 2Gi memory, 1 gpu"."""
    return (
        f"{format_cpu(resources.cpu_millis)} cpu, "
        f"{format_memory(resources.memory_bytes)} memory, {resources.gpus} gpu"
    )


def describe_shortfalls(node: str, short: tuple[Shortfall, ...]) -> str:
    # The extender's filter words this for every refused candidate: one lookup per resource.
    parts = [
        f"{resource}: requested {_FORMATS[resource](requested)}, free {_FORMATS[resource](free)}"
        for resource, requested, free in short
    ]
    return f"insufficient resources on node {node!r}: " + "; ".join(parts)
