"""What the bench reads from and does to the real Slurm cluster, through Slurm's own client
commands (squeue, scontrol, sbatch): the witnesses are independent of the service."""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass

from tests.support.slurm_cluster import SlurmCluster

SCALE = {"K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


@dataclass(frozen=True, slots=True)
class RunningJob:
    job_id: str
    node: str
    cpus: int
    memory_mb: int


@dataclass(frozen=True, slots=True)
class NodeCounts:
    """A Slurm node's size and its k8s GRES totals as Slurm has them now."""

    cpus: int
    memory_mb: int  # RealMemory - MemSpecLimit
    k8scpu: int
    k8smemory: int
    k8sgpu: int | None  # None: no k8sgpu entry
    gpus: int
    extra: str = ""


def scaled(count: str) -> int:
    """A GRES count as Slurm prints it: '32000', '30K' (= 30720)."""
    number = count.split("(")[0]
    if number and number[-1] in SCALE:
        return round(float(number[:-1]) * SCALE[number[-1]])
    return int(number)


def gres_counts(gres: str) -> dict[str, int]:
    counts = {}
    for entry in re.sub(r"\([^)]*\)", "", gres).split(","):
        parts = entry.split(":")
        if len(parts) >= 2 and parts[0]:
            counts[parts[0]] = scaled(parts[-1])
    return counts


def memory_mb(value: str) -> int:
    """squeue's %m: '2000M', '5G', '512K', '100' (MB)."""
    if value and value[-1] in SCALE:
        return -(-round(float(value[:-1]) * SCALE[value[-1]]) // SCALE["M"])
    return int(value)


def parse_squeue(output: str) -> list[RunningJob]:
    """``JOBID|NODE|cpu=4,mem=4000M,...|``: what Slurm allocated (squeue's %m would be per
    CPU for --mem-per-cpu jobs)."""
    jobs = []
    for line in output.splitlines():
        if line.strip():
            job_id, node, tres = (field.strip() for field in line.split("|")[:3])
            alloc = dict(item.partition("=")[::2] for item in tres.split(","))
            jobs.append(RunningJob(job_id, node, int(alloc["cpu"]), memory_mb(alloc["mem"])))
    return jobs


def parse_show_node(output: str) -> dict[str, NodeCounts]:
    """`scontrol show node -o`: one line per node, KEY=VALUE fields."""
    nodes = {}
    for line in output.splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        if "NodeName" not in fields:
            continue
        gres = gres_counts(fields.get("Gres", ""))
        spec = int(fields.get("MemSpecLimit", "0") or 0)
        nodes[fields["NodeName"]] = NodeCounts(
            cpus=int(fields["CPUTot"]),
            memory_mb=int(fields["RealMemory"]) - spec,
            k8scpu=gres.get("k8scpu", 0),
            k8smemory=gres.get("k8smemory", 0),
            k8sgpu=gres.get("k8sgpu", 0 if "gpu" in gres else None),
            gpus=gres.get("gpu", 0),
        )
    return nodes


SQUEUE = "squeue -h -t R,CG -O 'JobID:20|,NodeList:40|,tres-alloc:300|'"
SHOW_NODES = "scontrol show node -o"
SEPARATOR = "--- nodes ---"


class ChaosSlurm:
    def __init__(self, cluster: SlurmCluster) -> None:
        self.cluster = cluster

    def snapshot(self) -> tuple[list[RunningJob], dict[str, NodeCounts]]:
        """The jobs that hold resources now (running or completing; the bench submits
        single-node jobs), then every node's k8s totals: one call into the cluster."""
        out = self.cluster.run("sh", "-c", f"{SQUEUE} && echo '{SEPARATOR}' && {SHOW_NODES}")
        jobs, _, nodes = out.partition(SEPARATOR)
        return parse_squeue(jobs), parse_show_node(nodes)

    def counts(self) -> dict[str, NodeCounts]:
        return parse_show_node(self.cluster.run(*SHOW_NODES.split()))

    def counts_exact(self) -> dict[str, NodeCounts]:
        """The JSON form, with each node's ``extra`` (the token the service writes)."""
        data = json.loads(self.cluster.run("scontrol", "--json", "show", "nodes"))
        nodes = {}
        for node in data["nodes"]:
            gres = gres_counts(node["gres"])
            spec = node.get("specialized_memory", 0) or 0
            nodes[node["name"]] = NodeCounts(
                cpus=int(node["cpus"]),
                memory_mb=int(node["real_memory"]) - int(spec),
                k8scpu=gres.get("k8scpu", 0),
                k8smemory=gres.get("k8smemory", 0),
                k8sgpu=gres.get("k8sgpu", 0 if "gpu" in gres else None),
                gpus=gres.get("gpu", 0),
                extra=str(node.get("extra", "")),
            )
        return nodes

    def sbatch(self, *args: str) -> str:
        """The job id, or RuntimeError with Slurm's refusal."""
        try:
            return self.cluster.sbatch(*args)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"sbatch timed out: {exc}") from exc

    def cancel_all(self) -> None:
        self.cluster.cancel_all()

    def reset(self) -> None:
        self.cluster.reset()
