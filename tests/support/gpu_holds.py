"""A pod holding device 0 of gpu-1 by a hold job, and Slurm's GPU jobs queued on n3 beside
it: the jobs that run must leave the pod's share, device included (tests/gpu/test_lost_hold.py,
test_hold_fence.py)."""

from __future__ import annotations

from collections.abc import Callable

from fastapi.testclient import TestClient

from app.core.slurm_models import LedgerHolds, SlurmJob
from app.ledger.service import Ledger
from app.slurm.client import SlurmClient
from tests.slurm.helpers import admit
from tests.support.gpu import GPUS, NODE, SLURM_NODE
from tests.support.slurm_cluster import SlurmCluster, wait_until

CPUS, MEMORY_MB = 16, 32000
POD_CPUS, POD_MEMORY_MB, POD_DEVICE = 4, 8000, 0
JOB_CPUS, JOB_MEMORY_MB = 4, 6000


class Sampler:
    """Slurm's jobs on n3 against the ledger's pod, one listing per call."""

    def __init__(self, client: SlurmClient) -> None:
        self.client = client
        self.samples = 0
        self.breaches: list[str] = []
        self.on_device: set[str] = set()  # jobs seen with the pod's device

    def jobs(self) -> list[SlurmJob]:
        listing = self.client.get_jobs()
        assert listing is not None
        return [
            j
            for j in listing.items
            if j.holds_resources and LedgerHolds(self.client.user_name).holder_of(j) is None
            for a in j.allocations
            if a.node == SLURM_NODE
        ]

    def __call__(self) -> None:
        jobs = self.jobs()
        allocations = [a for j in jobs for a in j.allocations if a.node == SLURM_NODE]
        used = (
            sum(a.cpus for a in allocations),
            sum(a.memory_mb for a in allocations),
            sum(a.gpus for a in allocations),
        )
        left = (CPUS - POD_CPUS, MEMORY_MB - POD_MEMORY_MB, GPUS - 1)
        self.samples += 1
        if any(u > f for u, f in zip(used, left, strict=True)):
            names = [j.job_id for j in jobs]
            self.breaches.append(f"jobs {names} use {used} (cpus, MB, GPUs); pod leaves {left}")
        self.on_device |= {j.job_id for j in jobs for a in j.allocations if POD_DEVICE in a.devices}

    def until(self, done: Callable[[], bool], timeout: float, what: str) -> None:
        def sampled() -> bool:
            self()
            return done()

        wait_until(sampled, timeout, interval=0.2, what=what)

    def check(self) -> None:
        assert self.samples > 0
        assert self.breaches == [], self.breaches[:3]


JOB = ("-w", SLURM_NODE, "--gres=gpu:1", "-c", str(JOB_CPUS), f"--mem={JOB_MEMORY_MB}")


def admit_pod(slurm_api: TestClient, uid: str) -> str:
    answer = admit(
        slurm_api, NODE, uid, str(POD_CPUS), f"{POD_MEMORY_MB}Mi", gpu=1, devices=[POD_DEVICE]
    )
    assert answer.status_code == 201, answer.text
    hold: str = answer.json()["slurm_hold"]
    return hold


def running(slurm: SlurmCluster, job: str) -> bool:
    return slurm.job_state(job) == "RUNNING"


def current_hold(slurm_api: TestClient, uid: str) -> str | None:
    ledger: Ledger = slurm_api.app.state.services.ledger  # type: ignore[attr-defined]
    [holding] = [h for h in ledger.list_holdings(NODE) if h.holder.id == uid]
    return holding.slurm_hold
