"""job_submit/k8s_resource_completion inside each real Slurm release: every way of asking for
CPUs, memory and GPUs ends in the right k8scpu/k8smemory/k8sgpu per node, and never in
less than what Slurm then really allocates."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.slurm_cluster import SlurmCluster, wait_until

pytestmark = pytest.mark.slurm

# Created for this module: the plugin must honour partition-level exclusivity, memory
# limits and jobs that name several partitions.
PARTITIONS = {
    "whole": "OverSubscribe=EXCLUSIVE",  # every job gets whole nodes
    "capped": "MaxMemPerCPU=500",  # Slurm adds CPUs to keep memory per CPU under 500
}


@pytest.fixture(scope="module")
def partitions(slurm_cluster: SlurmCluster) -> Iterator[None]:
    for name, options in PARTITIONS.items():
        slurm_cluster.run("scontrol", "delete", f"PartitionName={name}", check=False)
        slurm_cluster.run("scontrol", "create", f"PartitionName={name}", "Nodes=n1,n2", options)
    yield
    for name in PARTITIONS:
        slurm_cluster.run("scontrol", "delete", f"PartitionName={name}", check=False)


@pytest.fixture
def slurm(slurm_cluster: SlurmCluster, partitions: None) -> Iterator[SlurmCluster]:
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


def job_k8s(slurm: SlurmCluster, job_id: str) -> dict[str, int]:
    return k8s_gres(str(slurm.job(job_id)["tres_per_node"]))


# (sbatch options, expected per-node counts). Nodes: 16 CPUs as 8 cores x 2 threads,
# 32000 MB, DefMemPerCPU=1000; n3 has 4 GPUs. Slurm allocates whole cores.
SBATCH_MATRIX: list[tuple[list[str], dict[str, int]]] = [
    ([], {"k8scpu": 2, "k8smemory": 2000}),
    (["-c", "2", "--mem=100"], {"k8scpu": 2, "k8smemory": 100}),
    (["-c", "3"], {"k8scpu": 4, "k8smemory": 4000}),
    (["-n", "5"], {"k8scpu": 6, "k8smemory": 6000}),
    (["-n", "3", "-c", "3"], {"k8scpu": 10, "k8smemory": 10000}),
    (["-n", "5", "--ntasks-per-node=3"], {"k8scpu": 4, "k8smemory": 4000}),
    (["-N", "2", "-n", "5"], {"k8scpu": 4, "k8smemory": 4000}),
    (["-N", "2", "--ntasks-per-node=3", "-c", "2"], {"k8scpu": 6, "k8smemory": 6000}),
    (["-N", "2", "-n", "4", "--mem-per-cpu=200"], {"k8scpu": 2, "k8smemory": 400}),
    (["-N", "3"], {"k8scpu": 2, "k8smemory": 2000}),
    (["--mincpus=5"], {"k8scpu": 6, "k8smemory": 6000}),
    (["--hint=nomultithread", "-n", "3"], {"k8scpu": 6, "k8smemory": 6000}),
    (["-n", "2", "--mem-per-cpu=50"], {"k8scpu": 2, "k8smemory": 100}),
    (["-c", "1", "--mem-per-cpu=300"], {"k8scpu": 2, "k8smemory": 600}),
    (["-n", "3", "--mem-per-cpu=100"], {"k8scpu": 4, "k8smemory": 400}),
    (["--mem=0"], {"k8scpu": 2, "k8smemory": 32000}),
    (["--mem-per-cpu=0"], {"k8scpu": 2, "k8smemory": 32000}),
    (["--exclusive"], {"k8scpu": 16, "k8smemory": 16000}),
    (["--exclusive", "--mem=8000"], {"k8scpu": 16, "k8smemory": 8000}),
    (["--exclusive", "--mem-per-cpu=100"], {"k8scpu": 16, "k8smemory": 1600}),
    (["-N", "2", "--exclusive"], {"k8scpu": 16, "k8smemory": 16000}),
    (["-w", "n3", "--gpus-per-node=2"], {"k8scpu": 2, "k8smemory": 2000, "k8sgpu": 2}),
    (["--gpus-per-node=2", "--mem-per-gpu=3000"], {"k8scpu": 2, "k8smemory": 6000, "k8sgpu": 2}),
    (["--gres=gpu:1", "--mem-per-gpu=4000"], {"k8scpu": 2, "k8smemory": 4000, "k8sgpu": 1}),
    (["-n", "2", "--gpus-per-task=1"], {"k8scpu": 2, "k8smemory": 2000, "k8sgpu": 2}),
    (["--gpus=2", "--cpus-per-gpu=3"], {"k8scpu": 6, "k8smemory": 6000, "k8sgpu": 2}),
    (["--gres=k8scpu:8"], {"k8scpu": 8, "k8smemory": 2000}),  # more than needed: kept
    (["-c", "4", "--gres=k8scpu:1"], {"k8scpu": 4, "k8smemory": 4000}),  # less: raised
    # Issue 30: every option of sbatch --help that changes what a node allocates.
    (["-n", "8", "--ntasks-per-core=1"], {"k8scpu": 16, "k8smemory": 16000}),
    (["-n", "4", "--ntasks-per-core=1", "--mem-per-cpu=500"], {"k8scpu": 8, "k8smemory": 4000}),
    (["-c", "2", "--ntasks-per-core=1"], {"k8scpu": 2, "k8smemory": 2000}),
    (["-c", "3", "--ntasks-per-core=1"], {"k8scpu": 4, "k8smemory": 4000}),
    (["-n", "2", "-c", "3", "--ntasks-per-core=1"], {"k8scpu": 8, "k8smemory": 8000}),
    (["-n", "3", "--ntasks-per-core=2"], {"k8scpu": 4, "k8smemory": 4000}),
    (["-n", "2", "--ntasks-per-core=1", "--mem=0"], {"k8scpu": 4, "k8smemory": 32000}),
    (["--mincpus=3", "--ntasks-per-core=1"], {"k8scpu": 6, "k8smemory": 6000}),
    (["--exclusive", "--ntasks-per-core=1"], {"k8scpu": 16, "k8smemory": 16000}),
    (["-n", "3", "--threads-per-core=1"], {"k8scpu": 6, "k8smemory": 6000}),
    (["-c", "3", "--threads-per-core=1"], {"k8scpu": 6, "k8smemory": 6000}),
    (["-n", "2", "--threads-per-core=1", "--mem-per-cpu=500"], {"k8scpu": 4, "k8smemory": 2000}),
    (["-c", "2", "--hint=nomultithread"], {"k8scpu": 4, "k8smemory": 4000}),
    (["-n", "2", "--hint=nomultithread", "--mem-per-cpu=500"], {"k8scpu": 4, "k8smemory": 2000}),
    (["-n", "3", "--hint=multithread"], {"k8scpu": 4, "k8smemory": 4000}),
    (["-n", "3", "--hint=compute_bound"], {"k8scpu": 6, "k8smemory": 6000}),
    (["-n", "3", "--hint=memory_bound"], {"k8scpu": 6, "k8smemory": 6000}),
    (["-n", "2", "--ntasks-per-socket=1"], {"k8scpu": 4, "k8smemory": 4000}),
    (["-n", "4", "--ntasks-per-socket=2"], {"k8scpu": 6, "k8smemory": 6000}),
    (["-n", "2", "-c", "3", "--ntasks-per-socket=1"], {"k8scpu": 8, "k8smemory": 8000}),
    (["-B", "2:2"], {"k8scpu": 4, "k8smemory": 4000}),
    (["--cores-per-socket=2"], {"k8scpu": 2, "k8smemory": 2000}),
    (["--sockets-per-node=2"], {"k8scpu": 2, "k8smemory": 2000}),
    (["--core-spec=1"], {"k8scpu": 2, "k8smemory": 2000}),
    (["--exclusive=user"], {"k8scpu": 2, "k8smemory": 2000}),
    (["-n", "2", "--exclusive=user"], {"k8scpu": 2, "k8smemory": 2000}),
    (["-n", "4", "--spread-job"], {"k8scpu": 4, "k8smemory": 4000}),
    (["-n", "4", "--overcommit"], {"k8scpu": 4, "k8smemory": 4000}),
    (["-n", "3", "-c", "3", "-m", "cyclic:cyclic"], {"k8scpu": 10, "k8smemory": 10000}),
    (["-n", "4", "-m", "plane=3"], {"k8scpu": 4, "k8smemory": 4000}),
    (["--tres-per-task=cpu=3"], {"k8scpu": 4, "k8smemory": 4000}),
    (
        ["--gpus-per-socket=1", "--sockets-per-node=1"],
        {"k8scpu": 2, "k8smemory": 2000, "k8sgpu": 2},
    ),
    (
        ["--gpus-per-socket=1", "--sockets-per-node=2"],
        {"k8scpu": 2, "k8smemory": 2000, "k8sgpu": 2},
    ),
    (
        ["--gpus-per-socket=1", "--sockets-per-node=1", "--cpus-per-gpu=3"],
        {"k8scpu": 6, "k8smemory": 6000, "k8sgpu": 2},
    ),
    (
        ["-c", "2", "--gpus-per-socket=1", "--sockets-per-node=1"],
        {"k8scpu": 2, "k8smemory": 2000, "k8sgpu": 2},
    ),
    (["--gpus-per-node=1", "--cpus-per-gpu=3"], {"k8scpu": 4, "k8smemory": 4000, "k8sgpu": 1}),
    (["-n", "3", "-c", "2", "--gpus-per-task=1"], {"k8scpu": 6, "k8smemory": 6000, "k8sgpu": 3}),
    (
        ["-n", "2", "--gpus-per-task=1", "--cpus-per-gpu=3"],
        {"k8scpu": 6, "k8smemory": 6000, "k8sgpu": 2},
    ),
    (
        ["-n", "3", "--cpus-per-gpu=2", "--gpus-per-task=1", "--ntasks-per-core=1"],
        {"k8scpu": 6, "k8smemory": 6000, "k8sgpu": 3},
    ),
    (["-n", "2", "--tres-per-task=gres/gpu:1"], {"k8scpu": 2, "k8smemory": 2000, "k8sgpu": 2}),
    (["--gres=gpu:2", "-n", "3"], {"k8scpu": 4, "k8smemory": 4000, "k8sgpu": 2}),
    (["--gres=gpu:g1:1"], {"k8scpu": 2, "k8smemory": 2000, "k8sgpu": 1}),
    (["--gpus=3", "--mem-per-gpu=1000"], {"k8scpu": 2, "k8smemory": 3000, "k8sgpu": 3}),
    (["-w", "n3", "--exclusive"], {"k8scpu": 16, "k8smemory": 16000}),
    (["-N", "2", "--ntasks-per-core=1"], {"k8scpu": 2, "k8smemory": 2000}),
    (["-N", "2", "-n", "4", "--ntasks-per-core=1"], {"k8scpu": 4, "k8smemory": 4000}),
    (["-N", "2", "-n", "6", "--threads-per-core=1"], {"k8scpu": 6, "k8smemory": 6000}),
    (["-N", "2", "--ntasks-per-node=3", "--hint=nomultithread"], {"k8scpu": 6, "k8smemory": 6000}),
    (["-N", "2", "--ntasks-per-node=2", "--ntasks-per-socket=1"], {"k8scpu": 4, "k8smemory": 4000}),
    (["-N", "2", "--exclusive=user"], {"k8scpu": 2, "k8smemory": 2000}),
    (["-N", "2", "-w", "n2,n3", "--exclusive"], {"k8scpu": 16, "k8smemory": 16000}),
    (["-N", "2", "-n", "4", "--spread-job"], {"k8scpu": 2, "k8smemory": 2000}),
    # Partitions made by the fixture.
    (["-p", "whole"], {"k8scpu": 16, "k8smemory": 16000}),
    (["-p", "whole", "--mem-per-cpu=100"], {"k8scpu": 16, "k8smemory": 1600}),
    (["-p", "debug,whole"], {"k8scpu": 16, "k8smemory": 16000}),  # either: the larger
    (["-p", "capped", "-c", "2", "--mem-per-cpu=1000"], {"k8scpu": 4, "k8smemory": 2000}),
    (["-p", "capped", "--mem=3000"], {"k8scpu": 6, "k8smemory": 3000}),
]


def _ids(value: object) -> str:
    return " ".join(value) or "(nothing)" if isinstance(value, list) else ""


@pytest.mark.parametrize(
    ("options", "expected"), SBATCH_MATRIX, ids=[_ids(options) for options, _ in SBATCH_MATRIX]
)
def test_sbatch(slurm: SlurmCluster, options: list[str], expected: dict[str, int]) -> None:
    job = slurm.sbatch("-H", *options, "--wrap", "true")
    assert job_k8s(slurm, job) == expected


def _job_gres(show_job_d: str) -> dict[str, dict[str, int]]:
    """Per job id, the GRES Slurm allocated the whole job (``JOB_GRES=`` of ``scontrol show
    job -d``, kept after the job ends; the JSON has no such field). GPU types are summed."""
    found: dict[str, dict[str, int]] = {}
    for record in re.split(r"(?=\bJobId=)", show_job_d):
        job_id = re.match(r"JobId=(\d+)", record)
        gres = re.search(r"\bJOB_GRES=(\S+)", record)
        if not job_id:
            continue
        counts: dict[str, int] = {}
        for entry in (gres.group(1) if gres else "").split(","):
            parts = entry.split(":")
            if len(parts) >= 2 and parts[-1].isdigit():
                counts[parts[0]] = counts.get(parts[0], 0) + int(parts[-1])
        found[job_id.group(1)] = counts
    return found


def _shortfalls(job: dict[str, Any], job_gres: dict[str, int]) -> list[str]:
    """Where Slurm allocated a node more CPUs, MB or GPUs than the job holds of k8scpu,
    k8smemory, k8sgpu there. What the job holds per node is its TresPerNode, or, when Slurm
    gave it more (whole-node jobs get every GRES of the node), its share of JOB_GRES: the
    same on every node for k8scpu/k8smemory (the nodes are alike), all on the one GPU node
    for GPUs and k8sgpu (no other node has any)."""
    nodes = job["job_resources"]["nodes"]["allocation"]
    asked = k8s_gres(job["tres_per_node"])
    assert len([n for n in nodes if n["name"] in GPU_NODES]) <= 1, "one node has GPUs"
    short = []
    for node in nodes:
        on_gpu_node = node["name"] in GPU_NODES
        gpus = job_gres.get("gpu", 0) if on_gpu_node else 0
        held = (
            max(asked.get("k8scpu", 0), job_gres.get("k8scpu", 0) // len(nodes)),
            max(asked.get("k8smemory", 0), job_gres.get("k8smemory", 0) // len(nodes)),
            max(asked.get("k8sgpu", 0), job_gres.get("k8sgpu", 0) if on_gpu_node else 0),
        )
        used = (node["cpus"]["count"], node["memory"]["allocated"], gpus)
        if any(u > h for u, h in zip(used, held, strict=True)):
            short.append(f"on {node['name']}: allocated (CPUs, MB, GPUs) {used} > held {held}")
    return short


GPU_NODES = {"n3"}


def test_counts_never_undercount_what_slurm_allocates(slurm: SlurmCluster) -> None:
    """The whole matrix run for real: per node, the k8s GRES cover the CPUs, memory and
    GPUs select/cons_tres allocated. This is what keeps Slurm off Kubernetes' share.
    Every form that undercounts is listed, not only the first."""
    jobs = {slurm.sbatch(*options, "--wrap", "true"): options for options, _ in SBATCH_MATRIX}
    seen: dict[str, tuple[dict[str, Any], dict[str, int]]] = {}

    def all_ended() -> bool:
        # Recorded as each job ends: slurmctld forgets ended jobs after MinJobAge.
        data = json.loads(slurm.run("scontrol", "--json", "show", "job"))["jobs"]
        active = {"PENDING", "RUNNING", "COMPLETING"}
        ended = {str(j["job_id"]): j for j in data if not active & set(j["job_state"])}
        new = [i for i in ended if i in jobs and i not in seen]
        if new:
            gres = _job_gres(slurm.run("scontrol", "show", "job", "-d"))
            seen.update({i: (ended[i], gres.get(i, {})) for i in new})
        return len(seen) == len(jobs)

    wait_until(all_ended, 240, interval=0.5, what="matrix jobs to finish")
    failures = []
    for job_id, (job, job_gres) in sorted(seen.items(), key=lambda item: int(item[0])):
        options = " ".join(jobs[job_id]) or "(nothing)"
        if job["job_state"] != ["COMPLETED"]:
            failures.append(f"[{options}] ended {job['job_state']}")
            continue
        failures += [f"[{options}] {short}" for short in _shortfalls(job, job_gres)]
    assert not failures, f"{len(failures)} of {len(jobs)} forms:\n" + "\n".join(failures)


def test_sbatch_with_ntasks_and_nodes_caps_tasks_per_node(slurm: SlurmCluster) -> None:
    job = slurm.sbatch("-H", "-N", "2", "-n", "5", "--wrap", "true")
    assert slurm.job(job)["tasks_per_node"]["number"] == 3


@pytest.mark.parametrize(
    ("options", "advice"),
    [
        (["-n", "20"], "spread it with -N/--nodes or --ntasks-per-node"),
        (["-c", "20"], "lower --cpus-per-task"),
        (["-n", "9", "--ntasks-per-core=1"], "spread it with -N/--nodes"),
        # Slurm applies --ntasks-per-gpu to every GRES (k8smemory:2000 -> 2000 tasks' CPUs):
        # refused with Slurm's "node configuration is not available" anyway, here with advice.
        (["-n", "4", "--ntasks-per-gpu=2"], "use -n with --gpus"),
        (["--gpus=2", "--ntasks-per-gpu=2"], "use -n with --gpus"),
    ],
    ids=_ids,
)
def test_a_request_no_node_can_hold_is_refused_with_advice(
    slurm: SlurmCluster, options: list[str], advice: str
) -> None:
    with pytest.raises(RuntimeError, match=re.escape(advice)):
        slurm.sbatch("-H", *options, "--wrap", "true")


def test_heterogeneous_job_components_each_get_their_own(slurm: SlurmCluster) -> None:
    job = slurm.sbatch("-H", "-c", "2", "--mem=100", ":", "-c", "6", "--mem=200", "--wrap", "true")
    components = json.loads(slurm.run("scontrol", "--json", "show", "job", job))["jobs"]
    by_offset = {c["het_job_offset"]["number"]: k8s_gres(c["tres_per_node"]) for c in components}
    assert by_offset == {0: {"k8scpu": 2, "k8smemory": 100}, 1: {"k8scpu": 6, "k8smemory": 200}}


@pytest.mark.parametrize(
    ("command", "options", "expected"),
    [
        ("srun", ["-c", "2", "--mem=500"], {"k8scpu": 2, "k8smemory": 500}),
        ("srun", ["-n", "3", "--mem-per-cpu=300"], {"k8scpu": 4, "k8smemory": 1200}),
        ("srun", ["--gpus=1"], {"k8scpu": 2, "k8smemory": 2000, "k8sgpu": 1}),
        ("salloc", ["-c", "2", "--mem=500"], {"k8scpu": 2, "k8smemory": 500}),
        ("salloc", ["--exclusive"], {"k8scpu": 16, "k8smemory": 16000}),
        ("salloc", ["-N", "2", "-n", "6"], {"k8scpu": 4, "k8smemory": 4000}),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else v if isinstance(v, str) else "",
)
def test_srun_and_salloc(
    slurm: SlurmCluster, command: str, options: list[str], expected: dict[str, int]
) -> None:
    name = f"plugin-{command}"
    proc = slurm.script_in_background("exec", command, "-H", "-J", name, *options, "true")
    try:
        job = wait_until(
            lambda: slurm.run("squeue", "-h", "-n", name, "-o", "%i").strip(), 10, what="job"
        )
        assert job_k8s(slurm, job) == expected
    finally:
        slurm.run("scancel", "-n", name, check=False)
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize(
    ("request_fields", "expected"),
    [
        (
            {"cpus_per_task": 4, "memory_per_node": {"set": True, "number": 1000}},
            {"k8scpu": 4, "k8smemory": 1000},
        ),
        (
            {"tasks": 3, "memory_per_cpu": {"set": True, "number": 300}},
            {"k8scpu": 4, "k8smemory": 1200},
        ),
        ({"tres_per_node": "gres/gpu:1"}, {"k8scpu": 2, "k8smemory": 2000, "k8sgpu": 1}),
    ],
    ids=["cpus_per_task+memory_per_node", "tasks+memory_per_cpu", "tres_per_node gpu"],
)
def test_rest_submit(
    slurm: SlurmCluster, request_fields: dict[str, Any], expected: dict[str, int]
) -> None:
    body = {
        "script": "#!/bin/sh\ntrue\n",
        "job": {
            "name": "plugin-rest", "hold": True, "current_working_directory": "/tmp",
            "environment": ["PATH=/bin"], **request_fields,
        },
    }  # fmt: skip
    answer = slurm.rest("POST", "job/submit", json=body)
    assert answer.status_code == 200, answer.text
    assert job_k8s(slurm, str(answer.json()["job_id"])) == expected


def test_job_modify_recomputes_and_never_duplicates(slurm: SlurmCluster) -> None:
    job = slurm.sbatch("-H", "-c", "2", "--mem=100", "--gres=gpu:0", "--wrap", "true")
    slurm.run("scontrol", "update", f"jobid={job}", "MinMemoryNode=3000")
    assert job_k8s(slurm, job) == {"k8scpu": 2, "k8smemory": 3000}
    slurm.run("scontrol", "update", f"jobid={job}", "NumTasks=3")
    slurm.run("scontrol", "update", f"jobid={job}", "NumTasks=3")
    assert job_k8s(slurm, job) == {"k8scpu": 6, "k8smemory": 3000}
    slurm.run("scontrol", "update", f"jobid={job}", "MinMemoryCPU=200")
    assert job_k8s(slurm, job) == {"k8scpu": 6, "k8smemory": 1200}
    slurm.run("scontrol", "release", job)  # job_modify runs on release too: no change
    time.sleep(0.5)
    assert slurm.job(job)["tres_per_node"].count("k8scpu") == 1
    assert job_k8s(slurm, job)["k8scpu"] == 6
