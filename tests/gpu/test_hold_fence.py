"""No job ever gets a GPU device a pod holds, however its hold job ends, on the real clusters.

A pod with GPU device 0 is admitted on n3 (four GPUs, one GRES type each) through the REST
API; its hold job holds device 0 in Slurm. When the hold ends, Slurm frees device 0 and
gives the next GPU job the lowest free device: the pod's. The prep/k8s_gpu_fence plugin
withholds every GPU of n3 (k8sgpu 0, and the same in the node's Extra) in the very
critical section in which slurmctld frees the device (docs/gpu-identity.md "When a hold
ends"); the service's sweep holds device 0 again, then gives the other GPUs back.

- ``scancel`` of the hold, and in the same shell, at once, ``sbatch --gres=gpu:1`` and a
  read of the node (every GPU withheld already): the job pends (the jobs queue) and runs on
  another device once the sweep has held device 0 again.
- Preemption: partition ``low`` (the default, PriorityTier 1, PreemptMode=REQUEUE) holds
  only the hold; jobs in ``mid`` (PriorityTier 5, not preemptable) use devices 1 and 2; a
  job in ``high`` (PriorityTier 10) asks exactly device 0, so that the hold is the only
  victim Slurm can preempt for it (a plain ``--gres=gpu:1`` job takes device 3, or, with
  every device busy, no k8sgpu is left for it: nothing is preempted). The hold is preempted
  and the job pends, the service kept blind meanwhile (slurmrestd paused); the sweep then
  cannot hold device 0 again (the job waits ahead of it): a conflict, reported.

Which device a job has is read twice: the IDX of ``scontrol -d show job`` while it runs and
its own ``$SLURM_JOB_GPUS``.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from app.core.records import EventKind
from app.slurm.client import SlurmClient
from tests.slurm.helpers import events
from tests.support.gpu_holds import JOB, NODE, SLURM_NODE, Sampler, admit_pod, current_hold, running
from tests.support.slurm_cluster import SlurmCluster, k8s_counts, wait_until

pytestmark = pytest.mark.slurm

POD_DEVICE = 0
OUT = "/srv/run/fence-%j.out"  # inside the cluster's root: the job writes $SLURM_JOB_GPUS
ECHO_GPUS = 'echo "$SLURM_JOB_GPUS"; sleep 600'
# Partitions on n3 for the preemption test (PreemptType=preempt/partition_prio, cluster.sh).
PARTITIONS = {
    "low": "PriorityTier=1 PreemptMode=REQUEUE Default=YES",
    "mid": "PriorityTier=5 PreemptMode=OFF",
    "high": "PriorityTier=10 PreemptMode=OFF",
}


def idx(slurm: SlurmCluster, job: str) -> set[int]:
    """The GPU devices of a running ``job``, from the IDX of ``scontrol -d show job``."""
    shown = slurm.run("scontrol", "-d", "show", "job", job)
    return {int(i) for i in re.findall(r"gpu:g\d+:1\(IDX:(\d+)\)", shown)}


def job_gpus(slurm: SlurmCluster, job: str) -> str:
    """``$SLURM_JOB_GPUS`` as the job itself printed it, once it has."""
    path = OUT.replace("%j", job)
    wait_until(
        lambda: slurm.run("cat", path, check=False).strip() != "", 30, what=f"job {job} output"
    )
    return slurm.run("cat", path).strip()


def until_held_again(
    slurm: SlurmCluster, slurm_api: TestClient, sample: Sampler, uid: str, first: str
) -> None:
    """Sampling, until the sweep has held device 0 again for ``uid`` (within its full pass,
    30 syncs of 1 s, each longer on busy cores: the bound is generous, the hold itself is
    what is waited for)."""

    def held_again() -> bool:
        hold = current_hold(slurm_api, uid)
        return hold not in (None, first) and running(slurm, str(hold))

    sample.until(held_again, 300, what="device 0 held again")


def checked(sample: Sampler) -> None:
    sample()
    sample.check()
    assert sample.on_device == set()  # no job seen on device 0 meanwhile


def test_a_gpu_job_right_after_a_scancel_of_the_hold_never_gets_the_pods_device(
    slurm: SlurmCluster, features_api: TestClient, client: SlurmClient
) -> None:
    """With each of the service's FEATURES: the headroom's pushes and the jobs queue's
    marker write the same counts and Extra the fence lowers. Without the jobs queue, the
    job asked while every GPU is withheld is refused at submit (docs/slurm.md), and asked
    again once the pod's device is held again."""
    sample = Sampler(client)
    first = admit_pod(features_api, "pod-fence-scancel")
    busy = slurm.sbatch(*JOB, "--wrap", "sleep 600")
    sample.until(lambda: running(slurm, busy), 60, what=f"job {busy} running")
    assert idx(slurm, busy) == {1}  # device 0 is held: the lowest free one is 1
    # An operator's scancel and, in the same shell, a GPU job, then the node's counts as
    # Slurm has them then: every GPU withheld at once, before the service could list.
    sbatch = shlex.join(["sbatch", "--parsable", *JOB, "-o", OUT, "--wrap", ECHO_GPUS])
    out = slurm.run(
        "sh",
        "-c",
        f"scancel {first} && {{ {sbatch} || echo refused; }} && scontrol show node {SLURM_NODE}",
    )
    [gres] = re.findall(r"\bGres=(\S*)", out)
    assert k8s_counts(gres)["k8sgpu"] == 0, out
    sample()
    until_held_again(slurm, features_api, sample, "pod-fence-scancel", first)
    job = out.split()[0].split(";")[0]
    if job == "refused":
        assert not features_api.app.state.settings.slurm.jobs_queue  # type: ignore[attr-defined]
        sample.until(
            lambda: slurm.k8s_counts(SLURM_NODE)["k8sgpu"] > 0, 60, what="the other GPUs back"
        )
        job = slurm.run("sh", "-c", sbatch).split(";")[0].strip()
    # Then the counts come back and the job runs, on another device.
    sample.until(lambda: running(slurm, job), 120, what=f"job {job} running")
    devices = idx(slurm, job)
    assert devices, slurm.run("scontrol", "-d", "show", "job", job)
    assert POD_DEVICE not in devices
    assert job_gpus(slurm, job) not in ("", str(POD_DEVICE))
    checked(sample)


@pytest.fixture
def partitions(slurm: SlurmCluster) -> Iterator[None]:
    for name, options in PARTITIONS.items():
        slurm.run("scontrol", "delete", f"PartitionName={name}", check=False)
        slurm.run(
            "scontrol", "create", f"PartitionName={name}", f"Nodes={SLURM_NODE}", *options.split()
        )
    try:
        yield
    finally:
        slurm.cancel_all()
        for name in PARTITIONS:
            slurm.run("scontrol", "delete", f"PartitionName={name}", check=False)
        slurm.run("scontrol", "update", "PartitionName=debug", "Default=YES")


def test_a_preempted_hold_gives_its_device_to_no_job(
    slurm: SlurmCluster, partitions: None, slurm_api: TestClient, client: SlurmClient
) -> None:
    sample = Sampler(client)
    first = admit_pod(slurm_api, "pod-fence-preempt")
    assert slurm.job(first)["partition"] == "low"
    busy = [slurm.sbatch("-p", "mid", *JOB, "--wrap", "sleep 600") for _ in range(2)]
    sample.until(lambda: all(running(slurm, j) for j in busy), 60, what="devices 1 and 2 busy")
    assert set().union(*(idx(slurm, j) for j in busy)) == {1, 2}
    # The service is kept blind meanwhile (slurmrestd paused; the checks below read
    # slurmctld): what keeps the job off device 0 then is Slurm's own state.
    slurm.pause_restd()
    try:
        job = slurm.sbatch("-p", "high", *JOB, "--gres=gpu:g0:1", "--wrap", "sleep 600")
        wait_until(lambda: not running(slurm, first), 60, what=f"hold {first} preempted")

        def settled() -> bool:
            return running(slurm, job) or slurm.k8s_counts(SLURM_NODE)["k8sgpu"] == 0

        wait_until(settled, 60, what=f"job {job} running, or every GPU of n3 withheld")
        assert not running(slurm, job), f"job {job} runs on devices {idx(slurm, job)}"
    finally:
        slurm.resume_restd()

    # The job waits ahead of any hold of device 0 (Slurm: "insufficient priority"), so the
    # sweep cannot hold it again: a conflict, recorded, which only a person can settle.
    # Meanwhile every GPU of n3 stays withheld and the job waits.
    def refused() -> bool:
        drift = events(slurm_api, NODE, EventKind.SLURM_DRIFT.value)
        return any("cannot be held again" in e["message"] for e in drift)

    sample.until(refused, 300, what="the sweep's refusal to hold device 0 again")
    assert slurm.job_state(job) == "PENDING"
    assert slurm.k8s_counts(SLURM_NODE)["k8sgpu"] == 0
    checked(sample)
