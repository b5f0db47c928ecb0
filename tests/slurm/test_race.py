"""Many rounds of parallel admissions, releases and Slurm submissions on one node: after
every round the invariant holds in the ledger and in Slurm (issue test 4), on SQLite and
PostgreSQL, with the headroom off and on (app.core.headroom), and with jobs waiting for
what pods hold (docs/slurm.md#jobs-wait-for-what-pods-hold) beside the headroom: jobs the
totals refuse then pend and start as pods go, instead of failing at submit."""

from __future__ import annotations

import random
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from tests.slurm.helpers import admit
from tests.support.slurm_cluster import SlurmCluster, wait_until
from tests.support.slurm_fixtures import HEADROOM, marked, register_nodes, slurm_settings
from tests.support.slurm_race import NODE, check_invariant

pytestmark = pytest.mark.slurm
ROUNDS = 8


# The jobs queue is on by default (the test clusters run extra_constraints); off, a job
# larger than what pods leave is refused at submit, as on a site without extra_constraints.
VARIANTS: dict[str, dict[str, object]] = {
    "headroom off": {},
    "headroom on": HEADROOM,
    "no jobs queue, headroom off": {"jobs_queue": False},
    "no jobs queue, headroom on": {**HEADROOM, "jobs_queue": False},
}


@pytest.fixture(params=list(VARIANTS))
def race_api(
    slurm: SlurmCluster, database_url: str, request: pytest.FixtureRequest
) -> Iterator[TestClient]:
    extra = VARIANTS[request.param]
    with TestClient(create_app(slurm_settings(slurm, database_url, **extra))) as api:
        register_nodes(api, slurm)
        if extra.get("jobs_queue", True):
            # The plugin queues a job only once every node of its partition is marked.
            wait_until(lambda: marked(slurm), 60, what="every node of the partition marked")
        yield api


def test_invariant_holds_through_racing_admissions_releases_and_jobs(
    race_api: TestClient, slurm: SlurmCluster, request: pytest.FixtureRequest
) -> None:
    queue = bool(VARIANTS[request.node.callspec.params["race_api"]].get("jobs_queue", True))
    rng = random.Random(7)
    live: list[str] = []
    admitted = rejected = submitted = 0
    refusals: list[str] = []
    for round_no in range(ROUNDS):
        new = [f"r{round_no}-p{i}" for i in range(5)]
        gone, live = live[:3], live[3:]

        def submit(_: int) -> str:
            cpus = rng.choice([2, 4, 6])
            try:
                return slurm.sbatch(
                    "-w", NODE, "-c", str(cpus), f"--mem={cpus * 500}",
                    f"--gres=k8scpu:{cpus},k8smemory:{cpus * 500}", "--wrap",
                    f"sleep {rng.choice([1, 2, 3])}",
                )  # fmt: skip
            except RuntimeError as exc:  # refused at submit (larger than the current total)
                refusals.append(str(exc)[-200:])
                return ""
            except subprocess.TimeoutExpired:
                return ""  # sbatch itself slow (busy cores): no answer either way

        with ThreadPoolExecutor(max_workers=10) as pool:
            jobs = pool.map(submit, range(3))
            results = pool.map(
                lambda uid: admit(race_api, NODE, uid, rng.choice(["1", "1500m", "3"]), "2Gi"),
                new,
            )
            released = pool.map(lambda uid: race_api.delete(f"/v1/admissions/{uid}"), gone)
            for uid, response in zip(new, results, strict=True):
                assert response.status_code in (201, 409), response.text
                if response.status_code == 201:
                    live.append(uid)
                    admitted += 1
                else:
                    rejected += 1
            assert all(r.status_code == 200 for r in released)
            submitted += sum(1 for j in jobs if j)
        check_invariant(race_api, slurm)
    events = race_api.get("/v1/events", params={"kind": "admitted", "limit": 1000}).json()
    within = sum(1 for e in events if e["details"].get("within_headroom"))
    print(
        f"{ROUNDS} rounds: {admitted} admitted ({within} inside the headroom), "
        f"{rejected} rejected, {submitted} jobs, {len(refusals)} refused at submit"
    )
    assert admitted
    assert submitted
    if queue:  # every job fits the node: none is refused for what pods hold
        assert refusals == [], refusals[:3]
