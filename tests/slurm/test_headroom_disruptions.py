"""Issue 30: an admission inside the headroom is never confirmed without Slurm on a grant
that a change Slurm made without the ledger falsified (app.slurm.witness), on the real
clusters.

slurmctld goes away (killed with -9, or shut down) and the service sees Slurm unreachable.
It comes back with the k8s counts it had before the last push, as a slurmctld that lost
its last saved state does, or a 24.11 one without the node_features plugin (modelled by
setting those counts: with the plugin, the clusters restore the ones pushed last), and
jobs take 14 CPUs at once. An admission that fits the grant from before must go through
Slurm then, and Slurm's running jobs plus the pods must fit the node. Before issue 30 it
was confirmed within the grant: 14 CPUs of jobs beside 3 of pods, on 16.

The sync runs every 30 s, so that its own drift repair (app.slurm.reconcile) cannot come
first: only the witness decides. The nodes are in the ledger before the service starts, so
that its first step marks them for the jobs queue, not the one 30 s later.
"""

from __future__ import annotations

import random
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from tests.slurm.helpers import admit, gres
from tests.support.slurm_cluster import SlurmCluster, wait_until
from tests.support.slurm_fixtures import register_nodes, service_with_nodes, slurm_settings
from tests.support.slurm_race import check_invariant, slurm_use, sync_check, within

pytestmark = pytest.mark.slurm
NODE = "n1"
SETTINGS = {
    "headroom_cpu": "2",
    "headroom_memory": "4Gi",
    "headroom_idle_seconds": 600,
    "sync_interval": 30,
}


@pytest.fixture
def ctld_restored(slurm: SlurmCluster) -> Iterator[SlurmCluster]:
    """The cluster, with slurmctld running again after the test (which may stop it)."""
    yield slurm
    if not slurm.ctld_pids():
        slurm.start_ctld()


def pods_cpus(api: TestClient) -> int:
    return -(-int(api.get(f"/v1/nodes/{NODE}").json()["held_by_kubernetes"]["cpu_millis"]) // 1000)


def node_state_saved(slurm: SlurmCluster) -> float:
    """When slurmctld last saved its nodes' state (0: being replaced right now)."""
    assert slurm.chroot is not None
    try:
        return (slurm.chroot / "srv/run/state/node_state").stat().st_mtime
    except FileNotFoundError:
        return 0.0


def assert_fits(api: TestClient, slurm: SlurmCluster, what: str) -> None:
    """Jobs and pods fit the node. The two sides are read one after the other, so the pods
    are read before and after the jobs: a 2-CPU job that ends between the reads while a
    pod takes its CPUs is no overlap; the fewer pods of the two reads is what held all
    along."""
    before = pods_cpus(api)
    jobs = slurm_use(slurm, NODE)[0]
    after = pods_cpus(api)
    pods = min(before, after)
    assert jobs + pods <= 16, f"{what}: jobs {jobs} CPUs beside pods {before}, then {after}"


@pytest.mark.parametrize("stop", ["kill -9", "shutdown"])
def test_no_admission_skips_slurm_on_a_grant_slurmctld_lost(
    ctld_restored: SlurmCluster, sqlite_url: str, stop: str
) -> None:
    slurm = ctld_restored
    with service_with_nodes(slurm_settings(slurm, sqlite_url, **SETTINGS), slurm) as api:
        assert admit(api, NODE, "p1", "1", "1Gi").status_code == 201  # through Slurm
        assert gres(slurm, NODE)["k8scpu"] == 13  # 1 CPU + 2 of headroom withheld
        assert admit(api, NODE, "p2", "500m", "512Mi").status_code == 201
        assert within(api, NODE) == ["p2"]  # the fast path is open before

        # Slurm forgets the last push (the counts from before it, nothing withheld), and
        # saves that: what a slurmctld that lost its last saved state comes back with.
        forgot = time.time()
        update = {"gres": SlurmCluster.full_gres(NODE), "extra": ""}
        slurm.rest("POST", f"node/{NODE}", json=update).raise_for_status()
        wait_until(lambda: node_state_saved(slurm) > forgot, 30, what="node state saved")
        if stop == "kill -9":
            slurm.kill_ctld()
        else:
            slurm.run("scontrol", "shutdown", "slurmctld")
            wait_until(lambda: not slurm.ctld_pids(), 30, what="slurmctld stopped")
        wait_until(
            lambda: sync_check(api).startswith("degraded: Slurm unreachable"),
            60,
            what="a sync step that found Slurm unreachable",
        )
        slurm.start_ctld()  # with the counts it saved: nothing withheld
        # Jobs take them at once.
        jobs = [
            slurm.sbatch("-w", NODE, "-c", str(cpus), "--mem=1000", "--wrap", "sleep 300")
            for cpus in (10, 4)
        ]
        wait_until(
            lambda: slurm_use(slurm, NODE)[0] == 14 or gres(slurm, NODE)["k8scpu"] < 16,
            30,
            what="14 CPUs of jobs running, or the counts pushed again",
        )
        # Inside the grant from before (2.5 CPUs held of 3): Slurm must decide.
        response = admit(api, NODE, "p3", "1", "512Mi")
        assert response.status_code in (201, 409), response.text
        assert_fits(api, slurm, f"p3 answered {response.status_code}")
        check_invariant(api, slurm)  # and once the sync caught up with Slurm
        slurm.scancel(*jobs)


DISRUPTIONS = {2: "reconfigure", 4: "restart_ctld", 6: "kill -9"}


def submit(slurm: SlurmCluster, cpus: int) -> str:
    """A job on the node; "" when Slurm refused it (larger than the node's current total)."""
    try:
        return slurm.sbatch("-w", NODE, "-c", str(cpus), "--mem=500", "--wrap", f"sleep {cpus}")
    except (RuntimeError, subprocess.TimeoutExpired):
        return ""


def test_a_race_through_reconfigure_restart_and_kill_keeps_jobs_and_pods_apart(
    ctld_restored: SlurmCluster, sqlite_url: str
) -> None:
    """Rounds of racing admissions, releases and jobs on one node, with slurmctld
    reconfigured, restarted and killed with -9 between them, a job of 4 CPUs always
    waiting to start the moment the counts let it: jobs and pods fit the node at every
    sample (the sync at its default interval)."""
    slurm = ctld_restored
    settings = slurm_settings(slurm, sqlite_url, headroom_cpu="2", headroom_memory="4Gi")
    rng = random.Random(30)
    with TestClient(create_app(settings)) as api:
        register_nodes(api, slurm)
        live: list[str] = []
        samples = 0
        for round_no in range(8):
            if (disruption := DISRUPTIONS.get(round_no)) == "kill -9":
                slurm.kill_ctld()
                slurm.start_ctld()
            elif disruption is not None:
                getattr(slurm, disruption)()
            gone, live = live[:2], live[2:]
            new = [f"r{round_no}-p{i}" for i in range(4)]
            with ThreadPoolExecutor(max_workers=6) as pool:
                jobs = pool.map(lambda cpus: submit(slurm, cpus), (4, rng.choice([2, 6])))
                admitted = pool.map(
                    lambda uid: admit(api, NODE, uid, rng.choice(["500m", "1", "2"]), "1Gi"),
                    new,
                )
                released = pool.map(lambda uid: api.delete(f"/v1/admissions/{uid}"), gone)
                for uid, response in zip(new, admitted, strict=True):
                    assert response.status_code in (201, 409), response.text
                    if response.status_code == 201:
                        live.append(uid)
                    assert_fits(api, slurm, f"round {round_no}, {uid}")
                    samples += 1
                assert all(r.status_code == 200 for r in released)
                list(jobs)
            for _ in range(5):
                assert_fits(api, slurm, f"after round {round_no}")
                samples += 1
        print(f"{samples} samples, {len(live)} pods left, {within(api, NODE)} inside")
