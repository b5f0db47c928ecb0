"""The one place that knows how slurmrestd's payloads differ between API versions.

v0.0.40 .. v0.0.45: Slurm 24.11 offers v0.0.40-42, 25.11 v0.0.41-44, 26.05 v0.0.42-45.
Differences handled here:
- numbers are plain or wrapped as {"set", "infinite", "number"};
- states are a string or a list of flags;
- per-node job allocations: v0.0.40 ``job_resources.allocated_nodes`` (CPU counts there
  are unreliable, so CPUs come from ``tres_alloc_str`` spread over the nodes, rounded up);
  v0.0.41+ ``job_resources.nodes.allocation`` with exact CPU and memory per node.
v0.0.45 changed nothing the service reads (its node, job and node-update schemas differ from
v0.0.44 only in fields not used here).

Listings are decoded into dicts of just the fields read here (``NODES``, ``JOBS``): at a
site's size they are big (15,003 nodes: 37 MB; 20,000 jobs: 164-200 MB, most of each job
its socket and core map), and msgspec skips what is not read without building it. On a
200 MB listing of 20,000 jobs: 0.4 s and ~35 MB beyond the body, where ``json.loads``
took 4.1 s and ~600 MB (``python -m bench.slurm_listings``). A field ``parse_node`` or
``parse_job`` reads must be in its shape: tests/slurm/test_cluster_smoke.py compares each
real listing with a parse of the whole answer.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, TypedDict

import msgspec

from app.core.gres import gres_count, gres_indices
from app.core.slurm_models import JobAllocation, SlurmJob, SlurmNode

SUPPORTED_VERSIONS = tuple(f"v0.0.{n}" for n in range(40, 46))
_VERSION_PATH = re.compile(r"^/slurm/(v0\.0\.\d+)/")


def newest_supported(paths: list[str]) -> str | None:
    """The newest supported version among the OpenAPI document's paths."""
    offered = {m.group(1) for p in paths if (m := _VERSION_PATH.match(p))}
    usable = [v for v in SUPPORTED_VERSIONS if v in offered]
    return max(usable, key=lambda v: int(v.rsplit(".", 1)[1])) if usable else None


def number(value: Any, default: int = 0) -> int:
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite", False):
            return default
        value = value.get("number", default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return default
    return int(value)


def states(value: Any) -> frozenset[str]:
    if isinstance(value, str):
        return frozenset(s for s in value.replace("+", ",").split(",") if s)
    if isinstance(value, list):
        return frozenset(str(s) for s in value)
    return frozenset()


class _Node(TypedDict, total=False):
    name: Any
    cpus: Any
    real_memory: Any
    specialized_memory: Any
    alloc_cpus: Any
    alloc_memory: Any
    gres: Any
    gres_used: Any
    state: Any
    reason: Any
    extra: Any
    partitions: Any
    comment: Any


class _Allocation(TypedDict, total=False):  # v0.0.41+; its socket and core map skipped
    name: Any
    cpus: Any
    memory: Any


class _JobNodes(TypedDict, total=False):
    allocation: list[_Allocation] | None


class _JobResources(TypedDict, total=False):
    nodes: _JobNodes | str | None  # v0.0.41+: per-node allocations; v0.0.40: a node list
    allocated_nodes: Any  # v0.0.40


class _Job(TypedDict, total=False):
    job_id: Any
    name: Any
    user_name: Any
    job_state: Any
    job_resources: _JobResources | None
    gres_detail: Any
    tres_alloc_str: Any
    comment: Any
    state_reason: Any
    tres_per_node: Any
    partition: Any  # "p" or, when several were asked, "p1,p2"
    extra: Any


class _NodesListing(TypedDict, total=False):
    nodes: list[_Node] | None
    last_update: Any
    errors: Any


class _JobsListing(TypedDict, total=False):
    jobs: list[_Job] | None
    last_update: Any
    errors: Any


NODES: msgspec.json.Decoder[_NodesListing] = msgspec.json.Decoder(_NodesListing)
JOBS: msgspec.json.Decoder[_JobsListing] = msgspec.json.Decoder(_JobsListing)


def parse_node(raw: Mapping[str, Any]) -> SlurmNode:
    return SlurmNode(
        name=str(raw["name"]),
        cpus=number(raw.get("cpus")),
        real_memory_mb=number(raw.get("real_memory")),
        specialized_memory_mb=number(raw.get("specialized_memory")),
        alloc_cpus=number(raw.get("alloc_cpus")),
        alloc_memory_mb=number(raw.get("alloc_memory")),
        gres=str(raw.get("gres") or ""),
        gres_used=str(raw.get("gres_used") or ""),
        states=states(raw.get("state")),
        reason=str(raw.get("reason") or ""),
        extra=str(raw.get("extra") or ""),
        partitions=frozenset(str(p) for p in raw.get("partitions") or ()),
        comment=str(raw.get("comment") or ""),
    )


def parse_job(raw: Mapping[str, Any]) -> SlurmJob:
    return SlurmJob(
        job_id=str(number(raw.get("job_id"))),
        name=str(raw.get("name") or ""),
        user=str(raw.get("user_name") or ""),
        states=states(raw.get("job_state")),
        allocations=_allocations(raw),
        comment=str(raw.get("comment") or ""),
        state_reason=str(raw.get("state_reason") or ""),
        tres_per_node=str(raw.get("tres_per_node") or ""),
        partitions=frozenset(p for p in str(raw.get("partition") or "").split(",") if p),
        extra=str(raw.get("extra") or ""),
    )


def _allocations(raw: Mapping[str, Any]) -> tuple[JobAllocation, ...]:
    resources = raw.get("job_resources") or {}
    gres_detail = list(raw.get("gres_detail") or [])

    def gpus(index: int) -> int:
        return gres_count(gres_detail[index], "gpu") if index < len(gres_detail) else 0

    def devices(index: int) -> tuple[int, ...]:
        return gres_indices(gres_detail[index], "gpu") if index < len(gres_detail) else ()

    nodes = resources.get("nodes")
    if isinstance(nodes, dict):  # v0.0.41+
        return tuple(
            JobAllocation(
                node=str(a["name"]),
                cpus=number((a.get("cpus") or {}).get("count")),
                memory_mb=number((a.get("memory") or {}).get("allocated")),
                gpus=gpus(i),
                devices=devices(i),
            )
            for i, a in enumerate(nodes.get("allocation") or [])
        )
    allocated = resources.get("allocated_nodes") or []
    if isinstance(allocated, dict):
        allocated = list(allocated.values())
    if not allocated:
        return ()
    total_cpus = _tres(str(raw.get("tres_alloc_str") or ""), "cpu")
    per_node_cpus = math.ceil(total_cpus / len(allocated))
    return tuple(
        JobAllocation(
            node=str(a.get("nodename") or a.get("name")),
            cpus=per_node_cpus,
            memory_mb=number(a.get("memory_allocated")),
            gpus=gpus(i),
            devices=devices(i),
        )
        for i, a in enumerate(allocated)
    )


def _tres(tres: str, name: str) -> int:
    for item in tres.split(","):
        key, _, value = item.partition("=")
        if key == name and value.isdigit():
            return int(value)
    return 0


def error_details(body: Any) -> list[dict[str, Any]]:
    if isinstance(body, dict) and isinstance(body.get("errors"), list):
        return [e for e in body["errors"] if isinstance(e, dict)]
    return []
