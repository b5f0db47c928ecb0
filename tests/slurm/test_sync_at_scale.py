"""The Slurm side at 1,000 nodes: a real slurmctld + slurmrestd whose slurm.conf defines
1,003 nodes (n1-n3 with a slurmd; s1-s1000 never register) with 1,000 held jobs in its queue,
and a real `nodeledger serve` in the shape the README gives a large site: nodes registered
from Slurm, job hints from slurmctld, full listings as a background reconcile. Behaviour,
not timing (bench/slurm_scale.py measures):
- every Slurm node reaches the ledger, readable page by page; the ones no slurmd answers
  for are not admissible, with Slurm's state as the reason;
- pod holdings recorded on 500 nodes behind the sync's back (another replica recorded them
  and died before pushing) are pushed by the next reconcile, to exactly those nodes, and
  the pass after pushes nothing;
- every node marked for the jobs queue (the default) by the first passes, once;
- counts reset on every node at once (an administrator's bulk update) come back on exactly
  the nodes that hold pods;
- held jobs hold nothing; running jobs are holdings while they run, by hints;
- after a slurmctld restart every node's counts are right and hints still arrive.
Each check reads every node back from Slurm (one `GET nodes/`), not a sample."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.core.records import Holder, HolderKind, Recording
from app.core.resources import Resources
from app.ledger.service import Ledger
from tests.support import workers
from tests.support.realenv import unavailable
from tests.support.service import ServiceProcess, running_service
from tests.support.slurm_cluster import (
    SLURM_VERSIONS,
    SlurmCluster,
    cluster_sh,
    k8s_counts,
    scale_env,
    seed_cache,
    wait_until,
)
from tests.support.slurm_fixtures import QUEUE_MARKER
from tests.support.slurm_hooks import ADMIN_TOKEN, hook_posting_to, service_env

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

VERSION = SLURM_VERSIONS[-1]  # the newest release the tests run a cluster of
SCALE_NODES = 1000
NODES = SCALE_NODES + 3
PORT_BASE = 17600  # beside the test clusters (16800, 17200) and bench.slurm_scale (17400)
FULL_SYNC = 3.0  # seconds between the service's reconcile listings
GIB = 1024**3
POD = Resources(3500, 5 * GIB)  # Slurm is told whole CPUs, rounded up: 4
POD_NODES = frozenset(f"s{i}" for i in range(2, SCALE_NODES + 1, 2))  # 500 nodes
FULL = {"k8scpu": 16, "k8smemory": 32000}
WITH_POD = {"k8scpu": 12, "k8smemory": 32000 - 5 * 1024}
NO_SLURMD = "reason=no slurmd"


@pytest.fixture(scope="module")
def big_slurm() -> Iterator[SlurmCluster]:
    """The cluster of 1,003 nodes beside the test clusters (own cache copied from theirs,
    ports, run directory), 1,000 held jobs queued; taken down at the end."""
    env = scale_env(
        SCALE_NODES,
        Path(f"{workers.cache()}-scale-test"),
        f"{workers.rundir()}-scale-test",
        workers.port(PORT_BASE),
    )
    try:
        seed_cache(VERSION, Path(env["NODELEDGER_CACHE"]))
        cluster_sh(VERSION, "up", timeout=1800, env=env)
        slurm = SlurmCluster.from_env(VERSION, env)
        slurm.cancel_all()
        # Deterministic states: without it they are UNKNOWN for SlurmdTimeout, then DOWN.
        slurm.run("scontrol", "update", f"nodename=s[1-{SCALE_NODES}]", "state=down", NO_SLURMD)
        slurm.submit_held(SCALE_NODES, "scale")
    except Exception as exc:  # any failure to start means the cluster is unavailable
        unavailable(f"Slurm {VERSION} cluster of {NODES} nodes", str(exc))
    try:
        yield slurm
    finally:
        cluster_sh(VERSION, "down", timeout=300, check=False, env=env)


class Site:
    """The service and the cluster, seen as an operator would: the ledger's REST API and
    Slurm's own listing."""

    def __init__(self, service: ServiceProcess, slurm: SlurmCluster) -> None:
        self.service = service
        self.slurm = slurm
        self.api = httpx.Client(
            base_url=service.url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=60
        )

    def ledger_nodes(self) -> dict[str, dict[str, Any]]:
        """Every node, page by page (1,000 at most per page)."""
        nodes: dict[str, dict[str, Any]] = {}
        url: str | None = "/v1/nodes?limit=1000"
        while url:
            response = self.api.get(url).raise_for_status()
            for node in response.json():
                assert node["name"] not in nodes, f"{node['name']} listed twice"
                nodes[node["name"]] = node
            url = response.links.get("next", {}).get("url")
        return nodes

    def slurm_counts(self) -> dict[str, tuple[dict[str, int], bool]]:
        """Every node's k8scpu/k8smemory totals and whether its Extra carries the jobs
        queue's marker (on by default), from one listing of all nodes."""
        listing = self.slurm.rest("GET", "nodes/", timeout=60).raise_for_status().json()
        return {
            n["name"]: (k8s_counts(n["gres"]), QUEUE_MARKER in (n.get("extra") or ""))
            for n in listing["nodes"]
        }

    def wrong_counts(self, pods: frozenset[str]) -> dict[str, tuple[dict[str, int], bool]]:
        """The nodes whose counts are not what the ledger withholds (pods on ``pods``) or
        that are not marked."""
        return {
            name: (counts, marked)
            for name, (counts, marked) in self.slurm_counts().items()
            if name.startswith("s")
            and ({k: counts[k] for k in FULL} != (WITH_POD if name in pods else FULL) or not marked)
        }

    def pushes(self, reason: str) -> float:
        text = self.api.get("/metrics").raise_for_status().text
        line = rf'^nodeledger_slurm_pushes_total{{reason="{reason}"}} (\S+)$'
        found = re.search(line, text, re.MULTILINE)
        return float(found.group(1)) if found else 0.0

    def reconciled(self, pods: frozenset[str]) -> None:
        """Wait until Slurm withholds exactly the pods on ``pods`` everywhere (a pass over
        1,000 nodes on busy cores: minutes)."""
        wait_until(
            lambda: not self.wrong_counts(pods), 300, interval=1, what="every node's counts right"
        )

    def job_holdings(self) -> set[str]:
        rows = self.api.get("/v1/holdings", params={"holder_kind": "slurm_job", "limit": 1000})
        return {row["holder"]["id"] for row in rows.raise_for_status().json()}


@pytest.fixture
def site(big_slurm: SlurmCluster, database_url: str, tmp_path: Path) -> Iterator[Site]:
    env = service_env(big_slurm, tmp_path)
    env.update(
        NODELEDGER_SLURM_REGISTER_NODES="true",
        NODELEDGER_SLURM_FULL_SYNC_INTERVAL=str(FULL_SYNC),
        NODELEDGER_SLURM_TIMEOUT="60",  # a listing of every node and job is megabytes
    )
    reset_counts(big_slurm)
    with (
        running_service(database_url, tmp_path, env=env, ready_timeout=120) as service,
        hook_posting_to(big_slurm, service.url),
    ):
        site = Site(service, big_slurm)
        try:
            yield site
        finally:
            site.api.close()
            # The next test starts with no running job; the held ones stay queued.
            big_slurm.run("scancel", "--partition=debug", check=False)
            wait_until(
                lambda: not big_slurm.run("squeue", "-h", "-p", "debug", "-o", "%i").strip(),
                60,
                what="the running jobs gone",
            )


def reset_counts(slurm: SlurmCluster) -> None:
    """Full counts and no nodeledger token on every s-node, in one update (what the
    node_features plugin would give them had they registered)."""
    gres = ",".join(f"{k}:{v}" for k, v in FULL.items())
    slurm.update_nodes(f"s[1-{SCALE_NODES}]", gres=gres, extra="")


def test_the_sync_keeps_a_thousand_nodes_right(site: Site, ledger: Ledger) -> None:
    slurm = site.slurm

    # Every Slurm node reaches the ledger; those without a slurmd are not admissible.
    wait_until(
        lambda: len(site.ledger_nodes()) == NODES, 120, interval=1, what=f"{NODES} nodes registered"
    )
    nodes = site.ledger_nodes()
    for name in ("n1", "n2", "n3"):
        assert nodes[name]["admissible"], nodes[name]
    unusable = [n for n in nodes.values() if n["name"].startswith("s")]
    assert all(not n["admissible"] for n in unusable)
    for node in unusable:  # DOWN, and NOT_RESPONDING once slurmctld noticed
        reason = rf"Slurm node {node['name']} is DOWN.*: no slurmd"
        assert re.fullmatch(reason, node["health_reason"]), node
    assert site.job_holdings() == set()  # 1,000 jobs queued, none holds anything

    # The first passes mark every node for the jobs queue (one push each, once).
    site.reconciled(frozenset())

    # Pods on 500 nodes recorded behind the sync's back: the next reconcile pushes exactly
    # those nodes, and the one after pushes nothing.
    drift_before = site.pushes("drift")
    ledger.record_many(
        [Recording(n, Holder(HolderKind.POD, f"pod-{n}"), POD) for n in sorted(POD_NODES)],
        reason="bound pod",
    )
    site.reconciled(POD_NODES)
    time.sleep(2 * FULL_SYNC)  # two more reconcile passes
    assert site.pushes("drift") - drift_before == len(POD_NODES)
    assert not site.wrong_counts(POD_NODES)

    # An administrator resets every node's counts at once: they come back where pods are.
    slurm.update_nodes(f"s[1-{SCALE_NODES}]", gres=",".join(f"{k}:{v}" for k, v in FULL.items()))
    site.reconciled(POD_NODES)
    assert site.pushes("drift") - drift_before == 2 * len(POD_NODES)

    # Running jobs are holdings (by hints) while the 1,000 held ones are not; ended: gone.
    sleeper = ("-c", "2", "--mem=500", "--wrap", "sleep 600")
    jobs = [slurm.sbatch("-w", node, *sleeper) for node in ("n1", "n2")]
    wait_until(lambda: site.job_holdings() == set(jobs), 30, what="running jobs held")
    slurm.scancel(jobs[0])
    wait_until(lambda: site.job_holdings() == {jobs[1]}, 30, what="the ended job released")

    # slurmctld restarts: every node's counts right again, and hints still arrive.
    slurm.restart_ctld()
    site.reconciled(POD_NODES)
    job = slurm.sbatch("-w", "n3", *sleeper)
    wait_until(lambda: site.job_holdings() == {jobs[1], job}, 30, what="a job after the restart")
    assert len(site.ledger_nodes()) == NODES
