"""The sync leader's sweep of hold jobs (app.slurm.hold_sweep) on the real clusters: a hold
no holding names is ended, and a holding whose hold job an operator cancelled is held
again, on exactly its devices, before a job can keep the device; a device a job took
meanwhile is a conflict the sweep reports, never ignores."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from app.core.records import EventKind
from app.ledger.service import Ledger
from app.main import create_app
from app.slurm.client import SlurmClient
from app.slurm.hold_sweep import HoldSweep
from app.slurm.holds import HoldJobs
from app.slurm.tokens import FileToken
from tests.slurm.helpers import admit, events
from tests.slurm.test_holds_cluster import devices, gpu_job
from tests.support.slurm_cluster import SlurmCluster, wait_until
from tests.support.slurm_fixtures import register_nodes, slurm_settings

pytestmark = pytest.mark.slurm

NODE, SLURM_NODE = "gpu-1", "n3"


@pytest.fixture
def sweep(slurm: SlurmCluster, slurm_api: TestClient) -> Iterator[HoldSweep]:
    client = SlurmClient(slurm.url, FileToken(slurm.token_file), user_name=slurm.user)
    ledger: Ledger = slurm_api.app.state.services.ledger  # type: ignore[attr-defined]
    yield HoldSweep(HoldJobs(client), ledger)
    client.close()


def listing(sweep: HoldSweep) -> list:  # type: ignore[type-arg]
    jobs = sweep.holds.client.get_jobs()
    assert jobs is not None
    return list(jobs.items)


def running(slurm: SlurmCluster, job: str) -> bool:
    return slurm.job_state(job) == "RUNNING"


def test_a_hold_no_holding_names_is_ended(
    sweep: HoldSweep, slurm: SlurmCluster, slurm_api: TestClient
) -> None:
    orphan = sweep.holds.hold(SLURM_NODE, "gone-pod", devices=(1,), cpus=1, memory_mb=100)
    kept = admit(slurm_api, NODE, "kept-pod", "1", "1Gi", gpu=1, devices=[2]).json()["slurm_hold"]
    assert sweep.sweep(listing(sweep)) == []
    wait_until(lambda: not running(slurm, orphan), 30, what=f"orphan hold {orphan} ended")
    assert running(slurm, kept)


def test_a_cancelled_hold_is_held_again_on_the_same_device(
    sweep: HoldSweep, slurm: SlurmCluster, slurm_api: TestClient
) -> None:
    first = admit(slurm_api, NODE, "pod-a", "1", "1Gi", gpu=1, devices=[3]).json()["slurm_hold"]
    slurm.scancel(first)  # an operator's scancel
    wait_until(lambda: not running(slurm, first), 30, what=f"hold {first} ended")
    listed_at = sweep.ledger.clock()  # as the sync does: only what the listing must show
    assert sweep.hold_lost(listing(sweep), listed_at) == []
    [holding] = sweep.ledger.list_holdings(NODE)
    assert holding.slurm_hold not in (None, first)
    assert holding.slurm_hold is not None
    assert devices(slurm, holding.slurm_hold) == (3,)
    drift = events(slurm_api, NODE, EventKind.SLURM_DRIFT.value)
    assert any("held again" in e["message"] for e in drift), drift


@pytest.fixture
def quiet_api(slurm: SlurmCluster, sqlite_url: str) -> Iterator[TestClient]:
    """The service with a sync that steps once at start and then not for an hour: nothing
    but the test's own sweep reacts to a hold that ends (a running sync would withhold
    every GPU of the node first, app.core.counts.withheld, and the job would wait)."""
    with TestClient(create_app(slurm_settings(slurm, sqlite_url, sync_interval=3600))) as api:
        register_nodes(api)  # no sync step to mark the nodes: the job gets no constraint
        yield api


def test_a_device_a_job_took_meanwhile_is_reported(
    slurm: SlurmCluster, quiet_api: TestClient
) -> None:
    client = SlurmClient(slurm.url, FileToken(slurm.token_file), user_name=slurm.user)
    ledger: Ledger = quiet_api.app.state.services.ledger  # type: ignore[attr-defined]
    sweep = HoldSweep(HoldJobs(client), ledger)
    first = admit(quiet_api, NODE, "pod-b", "1", "1Gi", gpu=1, devices=[0]).json()["slurm_hold"]
    slurm.scancel(first)
    wait_until(lambda: not running(slurm, first), 30, what=f"hold {first} ended")
    # The hold's end withheld every GPU of n3 (prep/k8s_gpu_fence); an operator gives them
    # back by hand, and a job takes device 0 now that it is free.
    assert slurm.k8s_counts(SLURM_NODE)["k8sgpu"] == 0
    slurm.set_gres(SLURM_NODE, SlurmCluster.full_gres(SLURM_NODE))
    job = gpu_job(slurm, "gpu:g0:1")
    wait_until(lambda: running(slurm, job), 30, what=f"job {job} running")
    listed_at = sweep.ledger.clock()
    [failure] = sweep.hold_lost(listing(sweep), listed_at)
    assert "pod-b" in failure
    drift = events(quiet_api, NODE, EventKind.SLURM_DRIFT.value)
    assert any("cannot be held again" in e["message"] for e in drift), drift
    client.close()
