"""/metrics of a service with the Slurm integration on, against the real Slurm cluster,
while admissions, releases and sbatch jobs race on one node (the race of
tests/slurm/test_race.py, shorter): every answer is counted under its result, the Slurm
requests, pushes and sync are measured, Slurm's holdings show in the node gauges while a
job runs, and the sync is fresh and up."""

from __future__ import annotations

import random
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.metrics.settings import MetricsSettings
from tests.metrics.scrape import Scrape, scrape
from tests.slurm.helpers import admit
from tests.support.slurm_cluster import SlurmCluster, wait_until
from tests.support.slurm_fixtures import register_nodes, slurm_settings
from tests.support.slurm_race import NODE, check_invariant, slurm_use

pytestmark = pytest.mark.slurm
ROUNDS = 3
REJECTED = ("rejected_ledger", "rejected_slurm", "failed_closed")


@pytest.fixture
def metrics_api(slurm: SlurmCluster, sqlite_url: str) -> Iterator[TestClient]:
    settings = slurm_settings(slurm, sqlite_url).model_copy(
        update={"metrics": MetricsSettings(cache_seconds=0)}  # every scrape reads the ledger
    )
    with TestClient(create_app(settings)) as api:
        register_nodes(api, slurm)
        yield api


def slurm_requests(s: Scrape, endpoint: str, outcome: str = "ok") -> float:
    return s.value(
        "nodeledger_slurm_request_duration_seconds_count", endpoint=endpoint, outcome=outcome
    )


def pods_cpu_millis(api: TestClient) -> int:
    held: int = api.get(f"/v1/nodes/{NODE}").json()["held_by_kubernetes"]["cpu_millis"]
    return held


def test_metrics_move_while_admissions_releases_and_jobs_race(
    metrics_api: TestClient, slurm: SlurmCluster
) -> None:
    api, rng = metrics_api, random.Random(11)
    before = scrape(api)

    # A job that outlives the race: what Slurm holds shows in the node gauges.
    long_job = slurm.sbatch("-w", NODE, "-c", "4", "--mem=2000", "--wrap", "sleep 60")
    wait_until(
        lambda: api.get(f"/v1/nodes/{NODE}").json()["held_by_slurm"]["cpu_millis"] >= 4000,
        10,
        what=f"the ledger sees job {long_job}",
    )
    s = scrape(api)
    assert s.value("nodeledger_node_held", node=NODE, resource="cpu", holder="slurm") >= 4
    assert s.value("nodeledger_node_held", node=NODE, resource="memory", holder="slurm") > 0
    assert s.value("nodeledger_cluster_held", resource="cpu", holder="slurm") >= 4

    answers: dict[int, int] = {}
    released = submitted = 0
    live: list[str] = []
    for round_no in range(ROUNDS):
        new = [f"m{round_no}-p{i}" for i in range(5)]
        gone, live = live[:3], live[3:]

        def submit(_: int) -> str:
            cpus = rng.choice([2, 4])
            try:
                return slurm.sbatch(
                    "-w", NODE, "-c", str(cpus), f"--mem={cpus * 500}", "--wrap", "sleep 2"
                )
            except (RuntimeError, subprocess.TimeoutExpired):
                return ""  # refused at submit: fine

        with ThreadPoolExecutor(max_workers=10) as pool:
            jobs = pool.map(submit, range(2))
            results = pool.map(
                lambda uid: admit(api, NODE, uid, rng.choice(["1", "1500m", "3"]), "2Gi"), new
            )
            releases = pool.map(lambda uid: api.delete(f"/v1/admissions/{uid}"), gone)
            for uid, response in zip(new, results, strict=True):
                answers[response.status_code] = answers.get(response.status_code, 0) + 1
                if response.status_code == 201:
                    live.append(uid)
            assert all(r.status_code == 200 for r in releases)
            released += len(gone)
            submitted += sum(1 for job in jobs if job)
        check_invariant(api, slurm)
    # One that cannot fit whatever raced: the node has 16 CPUs.
    assert admit(api, NODE, "too-big", "17").status_code == 409
    answers[409] = answers.get(409, 0) + 1

    # The pods that won the race may hold all the long job leaves (16 - 4 CPUs): then no pod
    # fits while it runs, rightly. Room for one small pod, whatever raced.
    while live and pods_cpu_millis(api) > 11_000:
        assert api.delete(f"/v1/admissions/{live.pop(0)}").status_code == 200
        released += 1

    # The releases above raced with admissions, so an admission's push may have answered
    # them all (coalesced); the pods left go one at a time, each with a push of its own.
    refusals: list[str] = []

    def admit_last() -> bool:
        response = admit(api, NODE, "last", "100m", "64Mi")
        answers[response.status_code] = answers.get(response.status_code, 0) + 1
        refusals.append(response.text)
        return response.status_code == 201

    try:
        wait_until(admit_last, 30, interval=0.5, what="a small pod fits once the jobs end")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the last answer: {refusals[-1]}") from exc
    for uid in [*live, "last"]:
        assert api.delete(f"/v1/admissions/{uid}").status_code == 200
    released += len(live) + 1

    after = scrape(api)

    def moved(name: str, **labels: str) -> float:
        return after.value(name, **labels) - before.value(name, **labels)

    admitted = moved("nodeledger_admissions_total", path="rest", result="admitted")
    rejected = sum(moved("nodeledger_admissions_total", path="rest", result=r) for r in REJECTED)
    assert submitted
    assert admitted == answers.get(201, 0) > 0
    assert rejected == answers[409] >= 1
    assert moved("nodeledger_admissions_total", path="rest", result="rejected_ledger") >= 1
    assert moved("nodeledger_admissions_total", path="rest", result="failed_closed") == 0
    assert moved("nodeledger_releases_total", path="rest") == released
    assert moved("nodeledger_admission_duration_seconds_count", phase="slurm") >= admitted
    assert moved("nodeledger_admission_duration_seconds_count", phase="ledger") == sum(
        answers.values()
    )

    # slurmrestd was asked, and answered, through every endpoint the service uses.
    for endpoint in ("GET nodes", "GET jobs", "GET node", "POST node"):
        assert slurm_requests(after, endpoint) > slurm_requests(before, endpoint), endpoint
    assert slurm_requests(after, "GET node", "unavailable") == 0
    assert moved("nodeledger_slurm_pushes_total", reason="admission") > 0
    assert moved("nodeledger_slurm_pushes_total", reason="release") > 0
    assert moved("nodeledger_slurm_sync_duration_seconds_count") > 0

    # The sync is up, fresh (interval 1 s) and leads; the long job is still held.
    assert after.value("nodeledger_slurm_up") == 1
    assert after.value("nodeledger_slurm_staleness_seconds") < 3
    assert after.value("nodeledger_leader", role="slurm-sync") == 1
    assert slurm_use(slurm)[0] >= 4
    assert after.value("nodeledger_node_held", node=NODE, resource="cpu", holder="slurm") >= 4
    held_by_pods = after.value(
        "nodeledger_node_held", node=NODE, resource="cpu", holder="kubernetes"
    )
    assert (
        held_by_pods
        == api.get(f"/v1/nodes/{NODE}").json()["held_by_kubernetes"]["cpu_millis"] / 1000
    )
    print(f"{ROUNDS} rounds: answers {answers}, {released} released, {submitted} jobs")
