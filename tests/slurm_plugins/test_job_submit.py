"""job_submit/k8s_resource_completion inside the real Slurm 24.11: every way of asking for
CPUs, memory and GPUs ends in the right k8scpu/k8smemory/k8sgpu per node."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator

import pytest

from tests.support.slurm_cluster import SCRIPT, SlurmCluster, wait_until

pytestmark = pytest.mark.slurm


@pytest.fixture
def slurm(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    slurm_cluster.reset()
    yield slurm_cluster
    slurm_cluster.reset()


def k8s_gres(tres_per_node: str) -> dict[str, int]:
    """The k8s entries of a job's TresPerNode; a duplicate entry fails the test."""
    found: dict[str, int] = {}
    for entry in tres_per_node.split(","):
        name, _, count = entry.removeprefix("gres/").partition(":")
        if name.startswith("k8s"):
            assert name not in found, f"duplicate {name} in {tres_per_node}"
            found[name] = int(count)
    return found


def tres_per_node(slurm: SlurmCluster, job_id: str) -> str:
    return str(
        json.loads(slurm.run("scontrol", "--json", "show", "job", job_id))["jobs"][0][
            "tres_per_node"
        ]
    )


# (sbatch options, expected per-node counts). Nodes: 16 CPUs as 8 cores x 2 threads,
# 32000 MB, DefMemPerCPU=1000; n3 has 4 GPUs. Slurm allocates whole cores.
SBATCH_MATRIX = [
    ([], {"k8scpu": 2, "k8smemory": 2000}),
    (["-c", "2", "--mem=100"], {"k8scpu": 2, "k8smemory": 100}),
    (["-c", "3"], {"k8scpu": 4, "k8smemory": 4000}),
    (["-n", "5"], {"k8scpu": 6, "k8smemory": 6000}),
    (["-n", "2", "--mem-per-cpu=50"], {"k8scpu": 2, "k8smemory": 100}),
    (["-c", "1", "--mem-per-cpu=300"], {"k8scpu": 2, "k8smemory": 600}),
    (["-N", "2", "-n", "5"], {"k8scpu": 4, "k8smemory": 4000}),
    (["-N", "2", "--ntasks-per-node=3", "-c", "2"], {"k8scpu": 6, "k8smemory": 6000}),
    (["--mem=0"], {"k8scpu": 2, "k8smemory": 32000}),
    (["--exclusive"], {"k8scpu": 16, "k8smemory": 16000}),
    (["-w", "n3", "--gpus-per-node=2"], {"k8scpu": 2, "k8smemory": 2000, "k8sgpu": 2}),
    (["--gres=gpu:1", "--mem-per-gpu=4000"], {"k8scpu": 2, "k8smemory": 4000, "k8sgpu": 1}),
    (["-n", "2", "--gpus-per-task=1"], {"k8scpu": 2, "k8smemory": 2000, "k8sgpu": 2}),
    (["--gpus=2", "--cpus-per-gpu=3"], {"k8scpu": 6, "k8smemory": 6000, "k8sgpu": 2}),
    (["--hint=nomultithread", "-n", "3"], {"k8scpu": 6, "k8smemory": 6000}),
    (["--gres=k8scpu:8"], {"k8scpu": 8, "k8smemory": 2000}),  # more than needed: kept
    (["-c", "4", "--gres=k8scpu:1"], {"k8scpu": 4, "k8smemory": 4000}),  # less: raised
]


@pytest.mark.parametrize(
    ("options", "expected"), SBATCH_MATRIX, ids=lambda v: " ".join(v) if isinstance(v, list) else ""
)
def test_sbatch(slurm: SlurmCluster, options: list[str], expected: dict[str, int]) -> None:
    job = slurm.sbatch("-H", *options, "--wrap", "true")
    assert k8s_gres(tres_per_node(slurm, job)) == expected


def test_sbatch_with_ntasks_and_nodes_caps_tasks_per_node(slurm: SlurmCluster) -> None:
    job = slurm.sbatch("-H", "-N", "2", "-n", "5", "--wrap", "true")
    assert (
        json.loads(slurm.run("scontrol", "--json", "show", "job", job))["jobs"][0][
            "tasks_per_node"
        ]["number"]
        == 3
    )


def test_a_request_no_node_can_hold_is_refused_with_advice(slurm: SlurmCluster) -> None:
    with pytest.raises(RuntimeError, match="spread it with -N/--nodes or --ntasks-per-node"):
        slurm.sbatch("-H", "-n", "20", "--wrap", "true")


def test_heterogeneous_job_components_each_get_their_own(slurm: SlurmCluster) -> None:
    job = slurm.sbatch("-H", "-c", "2", "--mem=100", ":", "-c", "6", "--mem=200", "--wrap", "true")
    components = json.loads(slurm.run("scontrol", "--json", "show", "job", job))["jobs"]
    by_offset = {c["het_job_offset"]["number"]: k8s_gres(c["tres_per_node"]) for c in components}
    assert by_offset == {0: {"k8scpu": 2, "k8smemory": 100}, 1: {"k8scpu": 6, "k8smemory": 200}}


@pytest.mark.parametrize("command", ["srun", "salloc"])
def test_srun_and_salloc(slurm: SlurmCluster, command: str) -> None:
    name = f"plugin-{command}"
    args = ["bash", str(SCRIPT), "exec", command, "-H", "-J", name, "-c", "2", "--mem=500", "true"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        job = wait_until(
            lambda: slurm.run("squeue", "-h", "-n", name, "-o", "%i").strip(), 10, what="job"
        )
        assert k8s_gres(tres_per_node(slurm, job)) == {"k8scpu": 2, "k8smemory": 500}
    finally:
        slurm.run("scancel", "-n", name, check=False)
        proc.terminate()
        proc.wait(10)


def test_rest_submit(slurm: SlurmCluster) -> None:
    body = {
        "script": "#!/bin/sh\ntrue\n",
        "job": {
            "name": "plugin-rest", "cpus_per_task": 4, "hold": True,
            "current_working_directory": "/tmp", "environment": ["PATH=/bin"],
            "memory_per_node": {"set": True, "number": 1000},
        },
    }  # fmt: skip
    answer = slurm.rest("POST", "job/submit", json=body)
    assert answer.status_code == 200, answer.text
    job = str(answer.json()["job_id"])
    assert k8s_gres(tres_per_node(slurm, job)) == {"k8scpu": 4, "k8smemory": 1000}


def test_job_modify_recomputes_and_never_duplicates(slurm: SlurmCluster) -> None:
    job = slurm.sbatch("-H", "-c", "2", "--mem=100", "--gres=gpu:0", "--wrap", "true")
    slurm.run("scontrol", "update", f"jobid={job}", "MinMemoryNode=3000")
    assert k8s_gres(tres_per_node(slurm, job)) == {"k8scpu": 2, "k8smemory": 3000}
    slurm.run("scontrol", "update", f"jobid={job}", "NumTasks=3")
    slurm.run("scontrol", "update", f"jobid={job}", "NumTasks=3")
    assert k8s_gres(tres_per_node(slurm, job)) == {"k8scpu": 6, "k8smemory": 3000}
    slurm.run("scontrol", "release", job)  # job_modify runs on release too: no change
    time.sleep(0.5)
    assert k8s_gres(tres_per_node(slurm, job))["k8scpu"] == 6
