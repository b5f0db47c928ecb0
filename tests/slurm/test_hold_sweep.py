"""The sync leader's sweep of hold jobs (app.slurm.hold_sweep) on the real clusters: a hold
no holding names is ended, and a holding whose hold job an operator cancelled is held
again, on exactly its devices, before a job can keep the device; a device a job took
meanwhile is a conflict the sweep reports, never ignores. An ordinary user's job named and
commented as a hold job is Slurm's: counted by the sync and the gate, never ended."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import httpx
import pytest
from fastapi.testclient import TestClient

from app.core.records import EventKind
from app.core.slurm_models import HOLD_JOB_NAME, hold_comment
from app.ledger.service import Ledger
from app.main import create_app
from app.slurm.client import SlurmClient
from app.slurm.hold_sweep import HoldSweep
from app.slurm.holds import HoldJobs
from app.slurm.tokens import FileToken
from tests.slurm.helpers import admit, events, slurm_holdings
from tests.support.gpu import devices, gpu_job
from tests.support.slurm_cluster import SlurmCluster, wait_until
from tests.support.slurm_fixtures import FEATURES, register_nodes, slurm_settings

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


@contextlib.contextmanager
def quiet_service(slurm: SlurmCluster, url: str, **features: object) -> Iterator[TestClient]:
    """The service with a sync that steps once at start and then not for an hour: nothing
    but the test's own sweep reacts to a hold that ends (a running sync would withhold
    every GPU of the node first, app.core.counts.withheld, and the job would wait)."""
    with TestClient(create_app(slurm_settings(slurm, url, sync_interval=3600, **features))) as api:
        register_nodes(api)  # no sync step to mark the nodes: the job gets no constraint
        yield api


@pytest.fixture
def quiet_api(slurm: SlurmCluster, sqlite_url: str) -> Iterator[TestClient]:
    with quiet_service(slurm, sqlite_url) as api:
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


ORDINARY = "nobody"  # a user of the test clusters that is neither SlurmUser nor root


def forged_hold(slurm: SlurmCluster, holder: str) -> str:
    """An ordinary user's job on 8 of n1's 16 CPUs, named and commented as the service's hold
    job of ``holder``; running, with the k8s GRES the job_submit plugin gives any user's."""
    as_user = ("setpriv", f"--reuid={ORDINARY}", "--regid=nogroup", "--clear-groups")
    job = slurm.run(
        *as_user, "sbatch", "--parsable", "-o", "/dev/null", "--chdir=/tmp", "-w", "n1",
        "-J", HOLD_JOB_NAME, f"--comment={hold_comment(holder)}", "-c", "8", "--mem=8000",
        "--wrap", "sleep 600",
    ).strip().split(";")[0]  # fmt: skip
    wait_until(lambda: running(slurm, job), 30, what=f"{ORDINARY}'s job {job} running")
    assert "gres/k8scpu:8" in str(slurm.job(job).get("tres_per_node")), slurm.job(job)
    return job


def manual(api: TestClient, holder: str, cpu: str) -> httpx.Response:
    body = {"node": "n1", "holder": {"kind": "manual", "id": holder},
            "requests": {"cpu": cpu, "memory": "100Mi"}}  # fmt: skip
    return api.post("/v1/admissions", json=body)


@pytest.mark.parametrize("feature", list(FEATURES))
@pytest.mark.parametrize("holder", ["anchor", "no-holding"])
def test_a_users_job_named_as_a_hold_is_confirmed_against_and_never_ended(
    slurm: SlurmCluster, sqlite_url: str, holder: str, feature: str
) -> None:
    """The gate's path (the sync lists once, before the job): a 15-CPU admission leaves
    k8scpu at 0, which Slurm then hides from gres_used, so the job listing tells what jobs
    use. ``holder``: the comment names a holder with a holding that names no hold job (the
    sweep kept such a job), or none (the sweep ended it). With each of FEATURES."""
    with quiet_service(slurm, sqlite_url, **FEATURES[feature]) as api:
        assert manual(api, "anchor", "1").status_code == 201
        job = forged_hold(slurm, holder)
        client = SlurmClient(slurm.url, FileToken(slurm.token_file), user_name=slurm.user)
        sweep = HoldSweep(HoldJobs(client), api.app.state.services.ledger)  # type: ignore[attr-defined]
        for _ in range(3):  # an orphan is ended at its second listing
            assert sweep.sweep(listing(sweep)) == []
        client.close()
        assert slurm.job_state(job) == "RUNNING"
        refused = manual(api, "fill", "15")
        assert refused.status_code == 409, refused.text
        assert "cpu: Slurm uses 8 of 16 CPUs" in refused.json()["detail"]
        assert slurm.job_state(job) == "RUNNING"


def test_a_users_job_named_as_a_hold_is_held_by_slurm_in_the_ledger(
    slurm: SlurmCluster, features_api: TestClient
) -> None:
    """The sync's path: the job becomes a Slurm job's holding, and the admission that would
    not fit beside it is refused by the ledger, with the headroom on and the jobs queue off
    too."""
    assert manual(features_api, "anchor", "1").status_code == 201
    job = forged_hold(slurm, "anchor")
    wait_until(
        lambda: job in slurm_holdings(features_api, "n1"), 60, what=f"job {job} in the ledger"
    )
    node = features_api.get("/v1/nodes/n1").json()
    assert node["held_by_slurm"]["cpu_millis"] == 8000, node
    refused = manual(features_api, "fill", "15")
    assert refused.status_code == 409, refused.text
    assert slurm.job_state(job) == "RUNNING"
