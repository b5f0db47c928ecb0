"""What the benches stand on: the test cluster, `nodeledger serve` processes and the
requests they send, taken from the tests' own helpers (``tests.support``; for the GPU
benches, tests/gpu's node gpu-1 with its DRA devices and its service) so a bench and a
test start the same service and the same cluster the same way. Benches import these from
here, never from each other or from ``tests.support``.
"""

from __future__ import annotations

import argparse
import re
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from bench._stats import timed
from tests.support.bulk import fill, node_name
from tests.support.databases import migrated, postgres_database, postgres_server_url
from tests.support.gpu import (
    NODE,
    OURS,
    RESOURCE,
    SCHEDULER,
    SLURM_NODE,
    TEST_LABEL,
    DraNode,
    GpuService,
    gpu_claim,
    gpu_pod,
    gpu_service,
    mapping_class,
    plain_pod,
)
from tests.support.gpu import dra_gpu_node as dra_node
from tests.support.kube_cluster import KubeCluster
from tests.support.kube_cluster import cluster_sh as kube_cluster_sh
from tests.support.net import free_port
from tests.support.realenv import wait_until
from tests.support.service import ServiceProcess, running_service
from tests.support.slurm_cluster import (
    REST_API,
    SlurmCluster,
    cluster_sh,
    main_cache,
    scale_env,
    seed_cache,
)

__all__ = [
    "GPU_NODE",
    "GPU_SLURM_NODE",
    "NODE_BODY",
    "NODE_CPUS",
    "NODE_MEMORY_MIB",
    "OURS",
    "RESOURCE",
    "REST_API",
    "SCHEDULER",
    "TEST_LABEL",
    "DraNode",
    "GpuService",
    "KubeCluster",
    "Service",
    "ServiceProcess",
    "SlurmCluster",
    "cluster",
    "cluster_sh",
    "dra_node",
    "fill",
    "free_port",
    "gpu_claim",
    "gpu_pod",
    "gpu_service",
    "headroom_services",
    "kube_cluster_sh",
    "main_cache",
    "mapping_class",
    "migrated",
    "node_name",
    "plain_pod",
    "pod",
    "postgres_database",
    "postgres_server_url",
    "raw_updates",
    "release_all",
    "running_service",
    "scale_env",
    "scrape",
    "seed_cache",
    "service_arguments",
    "sqlite_services",
    "wait_until",
]


# The GPU tests' node: gpu-1 in Kubernetes and the ledger, Slurm's n3 (tests/gpu).
GPU_NODE, GPU_SLURM_NODE = NODE, SLURM_NODE


def cluster(release: str) -> SlurmCluster:
    """The test cluster of ``release``, brought up (built and cached the first time)."""
    cluster_sh(release, "up", timeout=1800)
    return SlurmCluster.from_env(release)


def raw_updates(slurm: SlurmCluster, node: str, count: int) -> list[float]:
    """``count`` raw node updates of ``node`` straight to slurmrestd, each's ms (its k8scpu
    count between 16 and 15): the floor every Slurm-confirmed admission is compared with."""
    headers = {"X-SLURM-USER-NAME": slurm.user, "X-SLURM-USER-TOKEN": slurm.token}
    url = f"{slurm.url}/slurm/{REST_API}/node/{node}"
    full = SlurmCluster.full_gres(node)
    with httpx.Client(headers=headers, timeout=10) as client:
        client.post(url, json={"gres": full})  # warm the connection
        return [
            timed(
                lambda i=i: client.post(
                    url, json={"gres": full.replace("k8scpu:16", f"k8scpu:{16 - i % 2}")}
                ).raise_for_status()
            )
            for i in range(count)
        ]


def pod(node: str, uid: str, cpu: str = "1", memory: str = "1Gi") -> dict[str, Any]:
    """The body of POST /v1/admissions for a pod named by its uid."""
    holder = {"kind": "pod", "namespace": "bench", "name": uid, "uid": uid}
    return {"node": node, "holder": holder, "requests": {"cpu": cpu, "memory": memory}}


NODE_CPUS, NODE_MEMORY_MIB = 16, 32000  # the test cluster's nodes (cluster.sh)
NODE_BODY = {"capacity": {"cpu": str(NODE_CPUS), "memory": f"{NODE_MEMORY_MIB}Mi"}}


@contextmanager
def sqlite_services(
    envs: Mapping[str, Mapping[str, str]],
) -> Iterator[dict[str, ServiceProcess]]:
    """One `nodeledger serve` per name, each with the environment given and its own fresh
    SQLite ledger (logs in the same temporary directory), stopped afterwards."""
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        yield {
            name: stack.enter_context(
                running_service(
                    migrated(f"sqlite:///{tmp}/{name}.db"), Path(tmp), env=env, name=name
                )
            )
            for name, env in envs.items()
        }


# ---------------------------------------------------------------------------- driven services


@dataclass
class Service:
    """A running `nodeledger serve` a bench drives, owning the Slurm nodes it ``take``s
    (two services pushing one node's counts would fight) until it gives them back."""

    name: str
    url: str
    client: httpx.Client
    events_seen: list[dict[str, Any]] = field(default_factory=list)

    def take(self, nodes: list[str]) -> None:
        """The Slurm nodes become this service's (its ledger's, Slurm's sizes)."""
        for node in nodes:
            self.client.put(f"/v1/nodes/{node}", json=NODE_BODY).raise_for_status()

    def give_back(self, nodes: list[str], slurm: SlurmCluster) -> None:
        """Release every pod on ``nodes``, delete them from the ledger, and put Slurm's
        counts back as the cluster started (the next owner starts from there)."""
        for node in nodes:
            release_all(self.client, node)
            # A Slurm job's holding goes with the sync's next look at the node.
            wait_until(partial(self.delete, node), 30, what=f"{node} deleted")
        for node in nodes:
            slurm.set_gres(node, SlurmCluster.full_gres(node))
            slurm.rest("POST", f"node/{node}", json={"extra": ""}).raise_for_status()

    def delete(self, node: str) -> bool:
        return self.client.delete(f"/v1/nodes/{node}").status_code == 204

    def events(self) -> list[dict[str, Any]]:
        """Every event of the ledger so far (fetched once: the ledger keeps them)."""
        after = self.events_seen[-1]["id"] if self.events_seen else 0
        while True:
            page = self.client.get("/v1/events", params={"after": after, "limit": 1000}).json()
            self.events_seen.extend(page)
            if len(page) < 1000:
                return self.events_seen
            after = page[-1]["id"]

    def within_headroom(self) -> dict[str, bool]:
        """By pod uid: whether its admission was confirmed inside the headroom."""
        return {
            e["holder_id"]: bool(e["details"].get("within_headroom"))
            for e in self.events()
            if e["kind"] == "admitted"
        }

    def metrics(self) -> dict[str, float]:
        return scrape(self.client.get("/metrics").text)


def release_all(client: httpx.Client, node: str) -> list[float]:
    """Release every pod on ``node`` one after the other; each release's ms."""
    rows = client.get(
        "/v1/holdings", params={"node": node, "holder_kind": "pod", "limit": 1000}
    ).json()
    return [
        timed(lambda u=r["holder"]["id"]: client.delete(f"/v1/admissions/{u}").raise_for_status())
        for r in rows
    ]


METRIC_LINE = re.compile(r"^(nodeledger_[a-z_]+)(\{[^}]*\})? ([0-9.eE+-]+|NaN)$")


def scrape(text: str) -> dict[str, float]:
    """The service's admission and Slurm request figures, by series."""
    wanted = (
        "nodeledger_admission_duration_seconds_sum",
        "nodeledger_admission_duration_seconds_count",
        "nodeledger_admissions_within_headroom_total",
        "nodeledger_slurm_request_duration_seconds_sum",
        "nodeledger_slurm_request_duration_seconds_count",
        "nodeledger_slurm_pushes_total",
        "nodeledger_slurm_pushes_coalesced_total",
    )
    figures = {}
    for line in text.splitlines():
        found = METRIC_LINE.match(line)
        if found and found.group(1) in wanted:
            figures[found.group(1) + (found.group(2) or "")] = float(found.group(3))
    return figures


def service_arguments(parser: argparse.ArgumentParser, *, idle_seconds: float) -> None:
    """The arguments ``headroom_services`` reads (the "on" service's headroom) and
    ``--slurm``, the release of the test cluster."""
    parser.add_argument("--headroom-cpu", default="2")
    parser.add_argument("--headroom-memory", default="4Gi")
    parser.add_argument("--idle-seconds", type=float, default=idle_seconds)
    parser.add_argument("--slurm", default="26.05", help="Slurm release of the test cluster")
    parser.add_argument(
        "--jobs-queue",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="NODELEDGER_SLURM_JOBS_QUEUE of both Slurm services (the service's default: on; "
        "off, a job larger than what pods leave is refused at submit)",
    )


@contextmanager
def headroom_services(
    slurm: SlurmCluster, args: argparse.Namespace
) -> Iterator[dict[str, Service]]:
    """The two services, each with its own SQLite ledger, and a third with the Slurm
    integration off ("ledger": one ledger transaction per admission, the reference)."""
    common = dict(slurm.service_env)
    common["NODELEDGER_SLURM_JOBS_QUEUE"] = "true" if args.jobs_queue else "false"
    headroom = {
        "NODELEDGER_SLURM_HEADROOM_CPU": args.headroom_cpu,
        "NODELEDGER_SLURM_HEADROOM_MEMORY": args.headroom_memory,
        "NODELEDGER_SLURM_HEADROOM_IDLE_SECONDS": str(args.idle_seconds),
    }
    env = {"off": common, "on": {**common, **headroom}, "ledger": {}}
    with sqlite_services(env) as processes, ExitStack() as stack:
        yield {
            name: Service(
                name,
                process.url,
                stack.enter_context(httpx.Client(base_url=process.url, timeout=30)),
            )
            for name, process in processes.items()
        }
