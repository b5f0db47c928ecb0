"""Hold jobs (issue 23) on the real clusters, 24.11 and 26.05: a hold keeps Slurm's own jobs
off exactly the devices it names, a second hold of a held device is refused at once, a
cancel of the service's frees the device (marked released, it fences nothing), and the sync
does not take a hold for a Slurm job's holding."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.core.ledger_errors import AdmissionRejected
from app.slurm.client import SlurmClient
from app.slurm.holds import HoldJob, HoldJobs
from app.slurm.tokens import FileToken
from tests.slurm.helpers import admit, slurm_holdings
from tests.support.gpu import devices, gpu_job
from tests.support.slurm_cluster import SlurmCluster, wait_until

pytestmark = pytest.mark.slurm

NODE = "n3"  # the ledger's gpu-1


@pytest.fixture
def holds(slurm: SlurmCluster) -> Iterator[HoldJobs]:
    client = SlurmClient(slurm.url, FileToken(slurm.token_file), user_name=slurm.user)
    yield HoldJobs(client)
    client.close()


def test_a_hold_keeps_jobs_off_its_device_until_cancelled(
    slurm: SlurmCluster, holds: HoldJobs
) -> None:
    # Device 0: the one a plain --gres=gpu:1 job would get first (lowest free).
    started = time.perf_counter()
    hold = holds.hold(NODE, "pod-a", devices=[0], cpus=1, memory_mb=100)
    held_ms = (time.perf_counter() - started) * 1000
    assert slurm.job_state(hold) == "RUNNING"
    assert devices(slurm, hold) == (0,)
    assert holds.running() == {hold: HoldJob(hold, "pod-a", NODE, (0,))}

    started = time.perf_counter()
    with pytest.raises(AdmissionRejected, match=r"n3 .*gpu0.*busy") as refused:
        holds.hold(NODE, "pod-b", devices=[0], cpus=1, memory_mb=100)
    refused_ms = (time.perf_counter() - started) * 1000

    plain = gpu_job(slurm, "gpu:1")
    wait_until(lambda: slurm.job_state(plain) == "RUNNING", 30, what="the plain GPU job running")
    assert devices(slurm, plain) == (1,)  # not the held device 0

    waiting = gpu_job(slurm, "gpu:g0:1")  # exactly the held device: waits for it
    time.sleep(1)
    assert slurm.job_state(waiting) == "PENDING"
    started = time.perf_counter()
    holds.cancel(hold, slurm_node=NODE)
    # Marked released before its cancel: its end withholds none of the node's GPUs
    # (prep/k8s_gpu_fence fences only a hold that ends under its pod).
    assert slurm.k8s_counts(NODE)["k8sgpu"] > 0
    wait_until(lambda: slurm.job_state(waiting) == "RUNNING", 60, interval=0.05, what="device 0")
    freed_s = time.perf_counter() - started
    assert devices(slurm, waiting) == (0,)
    wait_until(lambda: holds.running() == {}, 60, what="no hold jobs")
    holds.cancel(hold, slurm_node=NODE)  # again: a no-op
    print(
        f"Slurm {slurm.release} API {holds.client.version}: hold {held_ms:.1f} ms, refusal "
        f"{refused_ms:.1f} ms ({refused.value}), the waiting job ran {freed_s:.2f} s after "
        "the cancel"
    )


def test_a_hold_of_several_devices_takes_them_all_or_none(
    slurm: SlurmCluster, holds: HoldJobs
) -> None:
    first = holds.hold(NODE, "pod-a", devices=[1], cpus=1, memory_mb=100)
    with pytest.raises(AdmissionRejected):
        holds.hold(NODE, "pod-b", devices=[1, 2], cpus=1, memory_mb=100)
    second = holds.hold(NODE, "pod-b", devices=[2, 3], cpus=1, memory_mb=100)
    assert devices(slurm, second) == (2, 3)
    assert {h.holder_id: h.devices for h in holds.running().values()} == {
        "pod-a": (1,),
        "pod-b": (2, 3),
    }
    holds.cancel(first)  # the node read from Slurm
    holds.cancel(second)
    # 24.11: a cancelled allocation is COMPLETING (and still holds) until slurmd's epilog.
    wait_until(lambda: holds.running() == {}, 60, what="no hold jobs")


def test_the_sync_leaves_the_ledgers_hold_jobs_out_of_slurm_holdings(
    slurm_api: TestClient, slurm: SlurmCluster
) -> None:
    hold = admit(slurm_api, "gpu-1", "pod-a", "1", "1Gi", gpu=1, devices=[0]).json()["slurm_hold"]
    plain = gpu_job(slurm, "gpu:1")
    wait_until(lambda: slurm.job_state(plain) == "RUNNING", 30, what="the plain GPU job running")

    def settled() -> dict[str, dict[str, Any]]:
        held = slurm_holdings(slurm_api, "gpu-1")
        return held if plain in held and f"node:{NODE}" not in held else {}

    held = wait_until(settled, 60, what="the plain job held, nothing unlisted")
    assert hold not in held
    assert held[plain]["requests"]["gpu"] == 1
    time.sleep(1.5)  # a later pass does not change its mind
    assert set(slurm_holdings(slurm_api, "gpu-1")) == {plain}


def test_an_admission_is_not_refused_by_its_own_hold_job(
    slurm_api: TestClient, slurm: SlurmCluster
) -> None:
    """A pod given every GPU of gpu-1 leaves k8sgpu at 0, which Slurm hides from gres_used:
    the gate's push reads the jobs instead, among them the pod's hold job, which the ledger
    records only once the gate has confirmed. It is the pod's own, not a Slurm job's."""
    answer = admit(slurm_api, "gpu-1", "all-gpus", "1", "1Gi", gpu=4, devices=[0, 1, 2, 3])
    assert answer.status_code == 201, answer.text
    hold = answer.json()["slurm_hold"]
    assert slurm.job_state(hold) == "RUNNING"
    assert devices(slurm, hold) == (0, 1, 2, 3)
