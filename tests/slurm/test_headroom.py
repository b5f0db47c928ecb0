"""The headroom (app.core.headroom) against the real Slurm clusters: admissions inside it
are confirmed with no Slurm call while Slurm withholds them; it is refilled off the
admission path and given back when idle; and it stays safe through a slurmctld restart
or reconfigure and Slurm unreachable (the grant void until Slurm confirms it again, fail
closed meanwhile), and a failover between two replicas on one database. The racing
admissions, releases and jobs of test_race.py also run with it on."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from tests.slurm.helpers import admit, events, gres
from tests.support.slurm_cluster import SlurmCluster, wait_until
from tests.support.slurm_fixtures import register_nodes, slurm_settings
from tests.support.slurm_race import slurm_use, sync_check, within

pytestmark = pytest.mark.slurm
HEADROOM = {"headroom_cpu": "2", "headroom_memory": "4Gi", "headroom_idle_seconds": 600}


def pods_cpus(api: TestClient, node: str) -> int:
    return -(-int(api.get(f"/v1/nodes/{node}").json()["held_by_kubernetes"]["cpu_millis"]) // 1000)


def assert_no_overlap(api: TestClient, slurm: SlurmCluster, node: str) -> None:
    jobs, _ = slurm_use(slurm, node)
    assert jobs + pods_cpus(api, node) <= 16, f"jobs {jobs} CPUs + pods on {node}"


@pytest.fixture
def headroom_api(slurm: SlurmCluster, sqlite_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(slurm_settings(slurm, sqlite_url, **HEADROOM))) as api:
        register_nodes(api, slurm)
        yield api


def test_admissions_inside_the_headroom_skip_slurm_and_slurm_withholds_them(
    headroom_api: TestClient, slurm: SlurmCluster
) -> None:
    api = headroom_api
    assert admit(api, "n1", "p1", "1", "1Gi").status_code == 201  # through Slurm
    # 1 CPU + 2 of headroom; 1 GiB + 4 GiB.
    assert gres(slurm, "n1") == {"k8scpu": 13, "k8smemory": 32000 - 5120, "k8sgpu": 0}
    assert admit(api, "n1", "p2", "500m", "512Mi").status_code == 201
    assert within(api, "n1") == ["p2"]
    # The admission sent nothing; a sync step may since have pushed held + target (12).
    assert gres(slurm, "n1")["k8scpu"] in (13, 12)
    # 2.5 CPUs held of the 3 granted: below half the headroom left, refilled in the back.
    assert admit(api, "n1", "p3", "1", "512Mi").status_code == 201
    assert within(api, "n1") == ["p2", "p3"]
    wait_until(lambda: gres(slurm, "n1")["k8scpu"] == 11, 10, what="refilled: 2.5 + 2 CPUs")
    node = api.get("/v1/nodes/n1").json()
    assert node["free"]["cpu_millis"] == 16000 - 2500
    # Slurm's jobs get what is neither held nor headroom (11 CPUs; whole cores: 10).
    job = slurm.sbatch("-w", "n1", "-c", "10", "--mem=1000", "--wrap", "sleep 30")
    wait_until(lambda: slurm.job_state(job) == "RUNNING", 15, what="job running")
    fill_up(api, slurm, "n1", first=4, jobs=10)
    slurm.scancel(job)


def fill_up(api: TestClient, slurm: SlurmCluster, node: str, *, first: int, jobs: int) -> None:
    """Admit 1-CPU pods beside running jobs of ``jobs`` CPUs until one is refused: never
    an overlap, and exactly what the jobs leave is admitted."""
    wait_until(lambda: slurm_use(slurm, node)[0] == jobs, 15, what=f"squeue shows {jobs} CPUs")
    uids = [f"f{i}" for i in range(first, first + 16)]
    for uid in uids:
        response = admit(api, node, uid, "1", "256Mi")
        assert_no_overlap(api, slurm, node)
        if response.status_code == 409:
            break
        assert response.status_code == 201, response.text
    assert pods_cpus(api, node) + jobs == 16


def test_a_release_stays_withheld_as_headroom_up_to_its_maximum(
    headroom_api: TestClient, slurm: SlurmCluster
) -> None:
    """A release on a node with a headroom tells Slurm nothing while the freed amount fits
    the node's maximum headroom (2 CPUs x 4): the next pod takes it without Slurm."""
    api = headroom_api

    def node() -> dict[str, Any]:
        return dict(api.get("/v1/nodes/n2").json())

    def release_pushes() -> list[str]:
        pushed = events(api, "n2", "slurm_pushed")
        return [e["message"] for e in pushed if e["message"].endswith("(released)")]

    # A sync step that listed Slurm before p1's push would lower the grant (app.slurm.push,
    # _grant_limit) and send p2 to Slurm: start once a whole step followed the nodes.
    steps = sync_steps(api)
    wait_until(lambda: sync_steps(api) >= steps + 2, 30, what="two Slurm sync steps")
    assert admit(api, "n2", "p1", "1").status_code == 201  # through Slurm: 1 + 2 withheld
    assert admit(api, "n2", "p2", "1").status_code == 201  # inside: 2 held of 3 granted
    for uid in ("p2", "p1"):
        assert api.delete(f"/v1/admissions/{uid}").status_code == 200
    assert node()["headroom"]["target"]["cpu_millis"] == 4000
    assert admit(api, "n2", "p3", "1").status_code == 201  # 2 left of 3: no refill
    assert within(api, "n2") == ["p2", "p3"]
    assert release_pushes() == []
    # Slurm still withholds the 3 CPUs it did, or what a sync step pushed since: held
    # (none, then p3's 1) + the 4 CPU target.
    assert gres(slurm, "n2")["k8scpu"] in (13, 16 - 4, 16 - 1 - 4)
    # 1 + 6 CPUs through Slurm (the grant is 3) beside the 4 CPU target; then 7 freed:
    # the target stops at 8, and Slurm gets the other 3 back.
    assert admit(api, "n2", "p4", "6").status_code == 201
    assert gres(slurm, "n2")["k8scpu"] == 16 - 7 - 4
    pushes = len(events(api, "n2", "slurm_pushed"))
    for uid in ("p3", "p4"):
        assert api.delete(f"/v1/admissions/{uid}").status_code == 200
    wait_until(lambda: gres(slurm, "n2")["k8scpu"] == 16 - 8, 10, what="given back beyond 8")
    # Pushed by the release, or by a sync step that saw the ledger first (under load).
    assert len(events(api, "n2", "slurm_pushed")) > pushes


def sync_steps(api: TestClient) -> float:
    for line in api.get("/metrics").text.splitlines():
        if line.startswith("nodeledger_slurm_sync_duration_seconds_count"):
            return float(line.split()[-1])
    return 0.0


def test_idle_headroom_goes_back_to_slurm(slurm: SlurmCluster, sqlite_url: str) -> None:
    settings = slurm_settings(slurm, sqlite_url, **{**HEADROOM, "headroom_idle_seconds": 2})
    with TestClient(create_app(settings)) as api:
        register_nodes(api, slurm)
        assert admit(api, "n2", "p1", "1").status_code == 201
        assert gres(slurm, "n2")["k8scpu"] == 13
        wait_until(lambda: gres(slurm, "n2")["k8scpu"] == 15, 10, what="headroom given back")
        given = [e for e in events(api, "n2", "headroom") if "given back" in e["message"]]
        assert len(given) == 1, events(api, "n2", "headroom")
        assert admit(api, "n2", "p2", "1").status_code == 201  # through Slurm again
        assert within(api, "n2") == []
        assert gres(slurm, "n2")["k8scpu"] == 12  # 2 CPUs + the headroom once more


@pytest.mark.parametrize("disruption", ["restart_ctld", "reconfigure"])
def test_the_headroom_survives_a_slurmctld_restart_or_reconfigure(
    headroom_api: TestClient, slurm: SlurmCluster, disruption: str
) -> None:
    api = headroom_api
    assert admit(api, "n1", "p1", "1").status_code == 201
    assert gres(slurm, "n1")["k8scpu"] == 13
    getattr(slurm, disruption)()
    # The node_features plugin restores what the extra field says is withheld (pods +
    # headroom), and the sync pushes again whatever was lost: never more left to jobs.
    wait_until(lambda: gres(slurm, "n1")["k8scpu"] == 13, 30, what="counts after " + disruption)
    # The service saw slurmctld start anew: the grant is void until a read-back confirms
    # it again (app.slurm.witness), so the next admission goes through Slurm.
    wait_until(lambda: voided(api, "n1"), 30, what="the grant voided")
    # Jobs take what Slurm may give; pods inside the headroom still fit beside them.
    job = slurm.sbatch("-w", "n1", "-c", "12", "--mem=1000", "--wrap", "sleep 30")
    wait_until(lambda: slurm.job_state(job) == "RUNNING", 15, what="job running")
    fill_up(api, slurm, "n1", first=2, jobs=12)
    assert within(api, "n1")[:2] == ["f3", "f4"]  # f2 through Slurm, which granted again
    slurm.scancel(job)


def voided(api: TestClient, node: str) -> bool:
    """Whether the node's grant was voided (lowered to nothing) since the test began."""
    return any("lowered to 0 cpu, 0 memory" in e["message"] for e in events(api, node, "headroom"))


def test_slurm_unreachable_closes_the_headroom_until_slurm_confirms_it_again(
    headroom_api: TestClient, restd_restarted: SlurmCluster
) -> None:
    """fail_open off: once the service saw slurmrestd away, no admission skips Slurm, since
    slurmctld may restart behind it with other counts (app.slurm.witness): all fail closed.
    Back, a read-back made after the service read slurmctld again grants again."""
    api, slurm = headroom_api, restd_restarted
    assert admit(api, "n1", "p1", "1").status_code == 201
    slurm.stop_restd()
    wait_until(
        lambda: sync_check(api).startswith("degraded: Slurm unreachable"),
        30,
        what="a sync step that found Slurm unreachable",
    )
    for uid, cpu in (("p2", "1"), ("p3", "2")):  # inside the grant from before, and beyond
        refused = admit(api, "n1", uid, cpu)
        assert refused.status_code == 409
        assert "Slurm cannot confirm" in refused.json()["detail"]
    assert voided(api, "n1")
    slurm.start_restd()
    wait_until(lambda: sync_check(api).startswith("synced"), 30, what="Slurm reached again")
    # The sync pushed the node the undos left owed (the counts were in place: 1 + 2 CPUs),
    # after it read slurmctld again: that read-back grants again.
    assert gres(slurm, "n1")["k8scpu"] == 13
    assert admit(api, "n1", "p2", "1").status_code == 201
    assert admit(api, "n1", "p3", "500m").status_code == 201
    assert within(api, "n1") == ["p2", "p3"]


def settings_for(slurm: SlurmCluster, url: str, **extra: Any) -> Any:
    return slurm_settings(slurm, url, **{**HEADROOM, **extra})


@pytest.mark.postgres
def test_a_failover_confirms_the_grant_again_and_the_new_leader_gives_it_back(
    slurm: SlurmCluster, postgres_url: str
) -> None:
    with TestClient(create_app(settings_for(slurm, postgres_url))) as first:
        register_nodes(first, slurm)
        assert admit(first, "n1", "p1", "1").status_code == 201
        assert gres(slurm, "n1")["k8scpu"] == 13
    # The first replica is gone. The second trusts no grant from before it read slurmctld
    # (which may have restarted meanwhile, app.slurm.witness): its first admission goes
    # through Slurm, whose read-back grants again.
    settings = settings_for(slurm, postgres_url, headroom_idle_seconds=3)
    with TestClient(create_app(settings)) as second:
        assert admit(second, "n1", "p2", "1").status_code == 201
        assert admit(second, "n1", "p3", "1").status_code == 201
        assert within(second, "n1") == ["p3"]
        wait_until(lambda: gres(slurm, "n1")["k8scpu"] == 13, 15, what="given back: 3 pods")
        assert_no_overlap(second, slurm, "n1")


def test_a_job_waiting_for_resources_gets_the_headroom_back(
    headroom_api: TestClient, slurm: SlurmCluster
) -> None:
    """Issue 31: a job that could run on the node if the headroom were not withheld pends
    (Reason=Resources); the sync step that sees it gives the headroom back and the job
    starts. Pods coming back set the headroom again."""
    api = headroom_api
    assert admit(api, "n1", "p1", "1").status_code == 201
    assert gres(slurm, "n1")["k8scpu"] == 13  # 1 CPU + 2 of headroom withheld
    running = slurm.sbatch("-w", "n1", "-c", "8", "--mem=1000", "--wrap", "sleep 300")
    wait_until(lambda: slurm.job_state(running) == "RUNNING", 15, what="the first job running")
    # 6 CPUs: 8 are free of jobs and pods, but only 5 of them are Slurm's with the headroom.
    waiting = slurm.sbatch("-w", "n1", "-c", "6", "--mem=1000", "--wrap", "sleep 300")
    wait_until(lambda: slurm.job_state(waiting) == "RUNNING", 60, what="the waiting job running")
    given = [e["message"] for e in events(api, "n1", "headroom") if "given back" in e["message"]]
    assert given, events(api, "n1", "headroom")
    assert "Slurm jobs wait for resources" in given[0]
    assert gres(slurm, "n1")["k8scpu"] == 15
    assert_no_overlap(api, slurm, "n1")
    slurm.scancel(running, waiting)
    wait_until(lambda: not slurm.run("squeue", "-h", "-w", "n1").strip(), 30, what="jobs gone")
    steps = sync_steps(api)  # until a sync step has seen no job waiting
    wait_until(lambda: sync_steps(api) >= steps + 2, 30, what="two Slurm sync steps")
    assert admit(api, "n1", "p2", "1").status_code == 201  # pods come back: through Slurm
    assert api.get("/v1/nodes/n1").json()["headroom"]["target"]["cpu_millis"] == 2000
    assert gres(slurm, "n1")["k8scpu"] == 12


@pytest.fixture
def no_queue_api(slurm: SlurmCluster, sqlite_url: str) -> Iterator[TestClient]:
    """The headroom without the jobs queue: a site whose slurm.conf lacks extra_constraints."""
    settings = slurm_settings(slurm, sqlite_url, jobs_queue=False, **HEADROOM)
    with TestClient(create_app(settings)) as api:
        register_nodes(api, slurm)
        yield api


def test_a_job_refused_at_submit_gets_the_headroom_back(
    no_queue_api: TestClient, slurm: SlurmCluster
) -> None:
    """Issue 31, without the jobs queue: a job asking more than the node's current k8s
    total is refused at submit and never pends; slurmctld keeps its record (FAILED,
    BadConstraints), and the sync step that lists it gives the headroom back. While it is
    listed, pods that come do not set the headroom again, so that the user's next try is
    accepted."""
    api = no_queue_api
    assert admit(api, "n1", "p1", "1").status_code == 201
    assert gres(slurm, "n1")["k8scpu"] == 13  # 1 CPU + 2 of headroom withheld
    with pytest.raises(RuntimeError, match="Requested node configuration is not available"):
        slurm.sbatch("-w", "n1", "-c", "13", "--mem=1000", "--wrap", "sleep 300")
    wait_until(lambda: gres(slurm, "n1")["k8scpu"] == 15, 30, what="the headroom given back")
    assert admit(api, "n1", "p2", "1").status_code == 201  # through Slurm, no headroom
    assert gres(slurm, "n1")["k8scpu"] == 14
    assert within(api, "n1") == []
    job = slurm.sbatch("-w", "n1", "-c", "13", "--mem=1000", "--wrap", "sleep 300")
    wait_until(lambda: slurm.job_state(job) == "RUNNING", 30, what="the job running")
    assert_no_overlap(api, slurm, "n1")
    slurm.scancel(job)
