"""Crash test: kill -9 of replicas at random points while admissions, releases and Slurm
jobs race on the same nodes, and what is left standing afterwards.

N real `nodeledger serve` replicas (default 3) share one PostgreSQL database, all with the
Slurm integration on, against a real Slurm cluster (n1, n2, n3: 16 CPUs, 32000 MB; n3 has
4 GPUs). Client threads admit pods (500m-4 CPUs, 1-4Gi) and release them through any
replica, sending a request whose answer was lost to the next replica, as a scheduler
would; other threads sbatch short jobs onto the same nodes. Meanwhile the bench kills one
replica with SIGKILL at random moments (seeded), mostly the one running the Slurm sync
(the leader, from /readyz), otherwise one it has just sent an admission or a release to,
and starts it again on the same port at once.

What it proves, printed as one JSON object:
- the oversubscription invariant held throughout: sampled every 0.2 s (or as fast as
  Slurm and the replicas answer), per node, CPUs and MB of the running Slurm jobs
  (squeue) plus what held pods take (the ledger, in Slurm's units) never exceed the
  node, and Slurm's k8scpu/k8smemory totals never overlap the held pods
  (bench/chaos/observe.py says why the samples are exact);
- after the load stops and one resync passes: no holding is lost or leaked against what
  the clients were told, none is left pending, and Slurm's counts (and the ``extra``
  token) on each node equal what the ledger withholds;
- how the leadership moved: changes seen, and the time from killing the leader to another
  replica syncing.

    python -m bench.chaos_kills [--kills 50] [--replicas 3] [--seed N] [--slurm 24.11]

Isolated from a test suite running on the same machine: give the Slurm cluster its own
chroot copy, run directory and ports (``--cache``, ``--rundir``, ``--port-base``, or the
NODELEDGER_CACHE / NODELEDGER_RUNDIR / NODELEDGER_SLURM_PORT_BASE variables that
testenv/slurm/cluster.sh reads); with ``--rundir`` the PostgreSQL of testenv/postgres/pg.sh
is a private one under it too. The bench resets that cluster (cancels every job, full
counts) before and after: never point it at a cluster tests are using.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from bench._fixtures import SlurmCluster, cluster_sh, free_port, migrated, postgres_server_url
from bench.chaos.api import Api, Findings, Traffic
from bench.chaos.checks import counts_check, holdings_check
from bench.chaos.kills import Killer, KillStats
from bench.chaos.observe import (
    InvariantSampler,
    LeaderStats,
    LeaderWatch,
    SamplerStats,
)
from bench.chaos.replicas import Replica, ReplicaPool, service_env
from bench.chaos.slurm import ChaosSlurm
from bench.chaos.workload import Book, JobStats, JobSubmitter, PodClient

NODES = ("n1", "n2", "n3")
Target = tuple[str, Callable[[], None]]  # a thread's name and what it runs


@dataclass
class Run:
    """Everything the threads of one run share."""

    args: argparse.Namespace
    pool: ReplicaPool
    slurm: ChaosSlurm
    findings: Findings = field(default_factory=Findings)
    traffic: Traffic = field(default_factory=Traffic)
    book: Book = field(default_factory=Book)
    jobs: JobStats = field(default_factory=JobStats)

    def api(self, seed: int) -> Api:
        return Api(self.pool.urls, self.findings, self.traffic, random.Random(seed))

    def pod_client(self, seed: int) -> PodClient:
        rng = random.Random(self.args.seed * 10_000 + seed)
        return PodClient(self.api(seed), self.book, self.findings, rng, NODES)


@contextmanager
def threads(targets: list[Target]) -> Iterator[None]:
    started = [threading.Thread(target=t, name=name, daemon=True) for name, t in targets]
    for thread in started:
        thread.start()
    try:
        yield
    finally:
        for thread in started:
            thread.join(timeout=60)


@dataclass(frozen=True)
class Driven:
    load_s: float
    settle_s: float
    kills: KillStats
    sampler: SamplerStats
    leader: LeaderStats


def drive(run: Run) -> Driven:
    """The load, the watchers and the kills; returns when every kill is done and the load
    has stopped."""
    args = run.args
    sizes = run.slurm.counts()
    sampler = InvariantSampler(run.api(1), run.slurm, sizes, run.findings, args.sample_interval)
    watch = LeaderWatch(run.pool.replicas, run.findings, 0.1)
    killer = Killer(
        run.pool,
        watch,
        run.pod_client,
        random.Random(args.seed),
        gap=(args.min_gap, args.max_gap),
        leader_share=args.leader_share,
    )
    stop_load, stop_watch = threading.Event(), threading.Event()
    clients = [run.pod_client(100 + i) for i in range(args.clients)]
    submitters = [
        JobSubmitter(run.slurm, run.jobs, random.Random(args.seed * 7 + i), NODES)
        for i in range(args.submitters)
    ]
    load: list[Target] = [
        (f"client-{i}", partial(c.run, stop_load, args.max_live, args.release_share))
        for i, c in enumerate(clients)
    ]
    load += [(f"sbatch-{i}", partial(s.run, stop_load)) for i, s in enumerate(submitters)]
    watchers: list[Target] = [
        ("sampler", partial(sampler.run, stop_watch)),
        ("leader", partial(watch.run, stop_watch)),
    ]
    started = time.monotonic()
    with threads(watchers):
        with threads(load):
            try:
                killer.run(args.kills, stop_load)
                time.sleep(args.max_gap)  # the load goes on a little after the last kill
            finally:
                stop_load.set()
        load_s = time.monotonic() - started
        settle_s = settle(run)
        stop_watch.set()
    for client in clients:
        client.api.close()
    return Driven(load_s, settle_s, killer.stats, sampler.stats, watch.stats)


def settle(run: Run) -> float:
    """Stop Slurm's side too (every job cancelled and gone), then let one resync pass."""
    started = time.monotonic()
    run.slurm.cancel_all()
    time.sleep(3 * run.args.sync_interval)
    return time.monotonic() - started


def final_checks(run: Run) -> dict[str, Any]:
    api = run.api(2)
    try:
        rows = api.get("/v1/holdings")
        nodes = api.get("/v1/nodes")
    finally:
        api.close()
    if rows is None or nodes is None:
        return {"error": "no replica answered"}
    counts = counts_check(run.slurm.counts_exact(), nodes)
    holdings = holdings_check(run.book, rows)
    slurm_left = [r["holder"]["id"] for r in rows if r["holder"]["kind"] == "slurm_job"]
    return {
        "holdings": holdings,
        "counts": counts,
        "slurm_job_holdings_left_after_jobs_ended": slurm_left,
        "ok": not (holdings["lost"] or holdings["leaked"] or holdings["pending"])
        and not (holdings["wrong_amounts"] or holdings["release_found_nothing"])
        and all(c["counts_match"] and c["extra_token_match"] for c in counts.values())
        and not slurm_left,
    }


def release_everything(run: Run) -> None:
    api = run.api(3)
    try:
        for row in api.get("/v1/holdings", {"holder_kind": "pod"}) or []:
            api.send("DELETE", f"/v1/admissions/{row['holder']['id']}")
    finally:
        api.close()


def distribution(samples: list[float]) -> dict[str, float] | None:
    if not samples:
        return None
    return {
        "p50": round(statistics.median(samples), 3),
        "max": round(max(samples), 3),
        "n": len(samples),
    }


def log_errors(replicas: list[Replica]) -> dict[str, Any]:
    """What the replicas logged at ERROR or worse, and their tracebacks' last lines."""
    errors: Counter[str] = Counter()
    tracebacks = 0
    for replica in replicas:
        lines = replica.log_path.read_text(errors="replace").splitlines()
        for i, line in enumerate(lines):
            if " ERROR " in line or " CRITICAL " in line:
                errors[line.split(": ", 1)[-1][:160]] += 1
            if line.startswith("Traceback"):
                tracebacks += 1
                end = next(
                    (j for j in range(i + 1, len(lines)) if not lines[j].startswith((" ", "\t"))),
                    i,
                )
                errors[f"traceback: {lines[end][:160]}"] += 1
    return {
        "dir": str(replicas[0].log_path.parent),
        "tracebacks": tracebacks,
        "messages": dict(errors.most_common(8)),
    }


def report(run: Run, driven: Driven, checks: dict[str, Any]) -> dict[str, Any]:
    kills, sampler, leader = driven.kills, driven.sampler, driven.leader
    book, jobs = run.book, run.jobs
    return {
        "setup": {
            "replicas": run.args.replicas,
            "database": "postgresql",
            "slurm": run.slurm.cluster.release,
            "seed": run.args.seed,
            "sync_interval_s": run.args.sync_interval,
            "clients": run.args.clients,
        },
        "duration_s": {"load": round(driven.load_s, 1), "settle": round(driven.settle_s, 1)},
        "kills": {
            "total": kills.total,
            "of_leader": kills.of_leader,
            "during_admission": kills.during_admission,
            "during_release": kills.during_release,
            "request_in_flight_when_killed": kills.request_in_flight,
            "leader_not_found": kills.leader_not_found,
            "by_kind": dict(kills.kinds),
            "restart_to_ready_s": distribution(run.pool.ready_seconds()),
        },
        "admissions": {
            "attempted": book.counts["admissions_attempted"],
            "admitted": book.counts["admitted"],
            "rejected": book.counts["rejected"],
            "rejected_by": dict(book.rejections),
            "answer_lost_then_retried": book.counts["admissions_answer_lost_then_retried"],
            "unanswered": book.counts["admissions_unanswered"],
        },
        "releases": {
            "attempted": book.counts["releases_attempted"],
            "released": book.counts["released"],
            "unanswered": book.counts["releases_unanswered"],
        },
        "http": dict(run.traffic.statuses),
        "slurm_jobs": {
            "submitted": jobs.submitted,
            "refused_at_submit": dict(jobs.refused),
            "seen_running": len(sampler.jobs_seen),
        },
        "invariant": {
            "samples": sampler.samples,
            "skipped": sampler.skipped,
            "violations": sampler.violations,
            "first_violations": sampler.first_violations,
            "peak_cpus_jobs_plus_pods": sampler.max_sum_cpus,
            "peak_cpus_jobs": sampler.max_jobs_cpus,
            "peak_cpus_pods": sampler.max_pods_cpus,
        },
        "leader": {
            "changes_seen": leader.changes,
            "polls": leader.polls,
            "polls_without_leader": leader.polls_without_leader,
            "polls_with_two_leaders": leader.polls_with_two_leaders,
            "roles_seen": dict(leader.roles_seen),
            "kill_to_new_leader_s": distribution(leader.takeover_s),
        },
        "final": checks,
        "findings": {"counts": dict(run.findings.kinds), "first": run.findings.items},
        "replica_logs": log_errors(run.pool.replicas),
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--kills", type=int, default=50)
    add("--replicas", type=int, default=3)
    add("--seed", type=int, default=1)
    add("--slurm", default="24.11", help="Slurm release of the cluster (24.11, 26.05)")
    add("--cache", help="NODELEDGER_CACHE for the cluster script (its own chroot copy)")
    add("--rundir", help="NODELEDGER_RUNDIR (the cluster's and PostgreSQL's runtime links)")
    add("--port-base", help="NODELEDGER_SLURM_PORT_BASE (e.g. 18800)")
    add("--postgres-url", help="server URL (default: testenv/postgres/pg.sh up)")
    add("--clients", type=int, default=4, help="threads admitting and releasing pods")
    add("--submitters", type=int, default=2, help="threads submitting Slurm jobs")
    add("--max-live", type=int, default=24, help="pods the clients keep alive at most")
    add("--release-share", type=float, default=0.45)
    add("--leader-share", type=float, default=0.6, help="share of kills aimed at the leader")
    add("--min-gap", type=float, help="seconds from a restart to the next kill (0.5; 3 alone)")
    add("--max-gap", type=float, help="... at most (2.5; 6 with one replica)")
    add("--sync-interval", type=float, default=0.5)
    add("--sample-interval", type=float, default=0.2)
    args = parser.parse_args(argv)
    # A lone replica must also serve between kills, not only restart.
    alone = args.replicas == 1
    args.min_gap = args.min_gap if args.min_gap is not None else (3.0 if alone else 0.5)
    args.max_gap = args.max_gap if args.max_gap is not None else (6.0 if alone else 2.5)
    return args


def cluster_environment(args: argparse.Namespace) -> None:
    """The cluster script (and pg.sh) read these from our environment."""
    for option, variable in (
        ("cache", "NODELEDGER_CACHE"),
        ("rundir", "NODELEDGER_RUNDIR"),
        ("port_base", "NODELEDGER_SLURM_PORT_BASE"),
    ):
        if getattr(args, option):
            os.environ[variable] = getattr(args, option)
    os.environ["NODELEDGER_SLURM_VERSION"] = args.slurm


def make_pool(
    args: argparse.Namespace, database: str, slurm: SlurmCluster, logs: Path
) -> ReplicaPool:
    env = {
        **slurm.service_env,
        "NODELEDGER_SLURM_REGISTER_NODES": "true",
        "NODELEDGER_SLURM_SYNC_INTERVAL": str(args.sync_interval),
    }
    replicas = []
    for index in range(args.replicas):
        port = free_port()
        replicas.append(
            Replica(index, port, logs / f"replica-{index}.log", service_env(database, port, env))
        )
    return ReplicaPool(replicas)


def wait_for_nodes(run: Run) -> None:
    api = run.api(4)
    deadline = time.monotonic() + 30
    try:
        while len(api.get("/v1/nodes") or []) < len(NODES):
            if time.monotonic() > deadline:
                raise RuntimeError("the Slurm sync registered no nodes in 30 s")
            time.sleep(0.1)
    finally:
        api.close()


@contextmanager
def database(server_url: str) -> Iterator[str]:
    """A new migrated database on the server, dropped afterwards whatever happened."""
    name = f"chaos_{uuid.uuid4().hex[:12]}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            yield migrated(make_url(server_url).set(database=name).render_as_string(False))
        finally:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    cluster_environment(args)
    cluster_sh(args.slurm, "up", timeout=1800)
    cluster = SlurmCluster.from_env(args.slurm)
    slurm = ChaosSlurm(cluster)
    slurm.reset()
    server = args.postgres_url or postgres_server_url()
    logs = Path(tempfile.mkdtemp(prefix="chaos-kills-"))
    with database(server) as db:
        pool = make_pool(args, db, cluster, logs)
        run = Run(args, pool, slurm)
        try:
            pool.start_all()
            wait_for_nodes(run)
            driven = drive(run)
            checks = final_checks(run)
            result = report(run, driven, checks)
            release_everything(run)
        finally:
            pool.stop_all()
            slurm.reset()
    print(json.dumps(result, indent=2, default=_jsonable))


def _jsonable(value: Any) -> Any:
    if isinstance(value, set):
        return sorted(value)
    raise TypeError(f"not JSON: {type(value).__name__}")


if __name__ == "__main__":
    main()
