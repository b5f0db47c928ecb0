"""The Slurm side at a real site's size: a real 26.05 slurmctld + slurmrestd whose slurm.conf
defines 15,000 nodes (three with a slurmd, the rest never register) and holds 20,000 jobs
(held, plus a few running on the live nodes).

Prints one JSON object:
- raw_node_update_ms / node_read_ms: one POST / GET /node/{name} (the floor);
- admission_ms: POST /v1/admissions through `nodeledger serve` (hold, push, read the node
  back, confirm), next to the raw update of the same run, and their p50 ratio;
- cluster_wide_reads: bytes and seconds of GET nodes/, jobs/state/ and jobs/ (what a
  full sync pass, or the old gate per admission, paid);
- staleness_s: from a job being RUNNING to the ledger showing it; with job hints (the
  default: slurmctld runs slurm-plugins/hooks/nodeledger-job-hint, the service lists
  everything only every 600 s) also release_staleness_s, from scancel returning to the
  ledger dropping the job;
- service: its CPU over 30 s left alone, its RSS, and its peak RSS since it started (every
  node registered, the first full listings read).

    python -m bench.slurm_scale [--nodes 15000] [--jobs 20000] [--samples 100] [--no-hints]
        [--database-url postgresql://user@host/db]

The cluster gets its own cache (a copy of the 26.05 test cluster's chroot), run directory and
ports, so it never disturbs the test clusters; it is taken down at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench._fixtures import (
    ServiceProcess,
    SlurmCluster,
    cluster_sh,
    main_cache,
    migrated,
    postgres_database,
    raw_updates,
    running_service,
    scale_env,
    seed_cache,
)
from bench._scenarios import threshold
from bench._stats import summary, timed
from bench.kubescale.proc import CpuWindow, peak_rss_mb, rss_mb
from bench.slurm_admission import admissions, staleness

VERSION = "26.05"
API = "v0.0.45"
CACHE = Path.home() / ".cache" / "nodeledger-scale"
# The test clusters' cache, whose chroot the scale cluster copies (read before os.environ
# points NODELEDGER_CACHE at the scale cluster's).
MAIN_CACHE = Path(os.environ.get("NODELEDGER_CACHE_MAIN", main_cache()))
SERVICE_LOG = Path("/tmp/nodeledger-scale-service.log")
# The Slurm -> ledger staleness target (p99, bench/scenarios.toml): a job the ledger let go
# of later than this after Slurm did is an outlier.
TARGET_S = threshold("slurm_scale", "staleness_p99").limit
IDLE_S = 30  # seconds the service is left alone for its idle CPU
METRICS = (  # what the service says about itself (by prefix; histograms: sum and count)
    "nodeledger_slurm_push",
    "nodeledger_slurm_sync_duration",
    "nodeledger_slurm_request_duration",
    "nodeledger_admission_duration",
)


def cluster_wide_reads(slurm: SlurmCluster) -> dict[str, Any]:
    headers = {"X-SLURM-USER-NAME": slurm.user, "X-SLURM-USER-TOKEN": slurm.token}
    figures: dict[str, Any] = {}
    with httpx.Client(base_url=slurm.url, headers=headers, timeout=600) as client:
        for path in ("node/n1", "job/1", "jobs/state/", "nodes/", "jobs/"):
            t0 = time.perf_counter()
            response = client.get(f"/slurm/{API}/{path}")
            seconds = time.perf_counter() - t0
            figures[path] = {
                "seconds": round(seconds, 3),
                "mb": round(len(response.content) / 1e6, 2),
            }
    return figures


def holds(client: httpx.Client, job: str) -> bool:
    rows = client.get("/v1/holdings", params={"node": "n3", "holder_kind": "slurm_job"}).json()
    return any(r["holder"]["id"] == job for r in rows)


def slurm_holds(slurm: httpx.Client, job: str) -> bool:
    """Whether Slurm still holds the job's node: RUNNING, or COMPLETING (its epilogs run,
    no other job may have the node yet)."""
    states = slurm.get(f"/slurm/{API}/job/{job}").json()["jobs"][0]["job_state"]
    return bool({"RUNNING", "COMPLETING"} & set(states))


@dataclass
class Sample:
    job: str
    event: str  # "start" or "end"
    at: float  # wall clock: RUNNING seen, or scancel returned
    seconds: float  # until the ledger showed it (``inf``: not within the limit)
    slurm_seconds: float = 0.0  # end: until Slurm itself let go of the node


def hinted_staleness(url: str, slurm: SlurmCluster, jobs: int, limit: float) -> list[Sample]:
    """Per job: seconds from RUNNING (as polled here, so up to one poll late) to the
    ledger's holding, and from scancel returning to the holding gone; for the end also
    when Slurm let go (the job no longer COMPLETING), polled alongside."""
    samples: list[Sample] = []
    headers = {"X-SLURM-USER-NAME": slurm.user, "X-SLURM-USER-TOKEN": slurm.token}
    with (
        httpx.Client(base_url=url, timeout=30) as client,
        httpx.Client(base_url=slurm.url, headers=headers, timeout=30) as rest,
    ):
        for _ in range(jobs):
            job = slurm.sbatch("-w", "n3", "-c", "2", "--mem=100", "--wrap", "sleep 600")
            while slurm.job_state(job) != "RUNNING":
                time.sleep(0.02)
            for event, present in (("start", True), ("end", False)):
                if not present:
                    slurm.scancel(job)
                at, t0 = time.time(), time.monotonic()
                seen = float("inf")
                let_go = 0.0 if present else float("inf")
                while time.monotonic() - t0 < limit:
                    if let_go == float("inf") and not slurm_holds(rest, job):
                        let_go = time.monotonic() - t0
                    if holds(client, job) == present:
                        seen = time.monotonic() - t0
                        break
                    time.sleep(0.02)
                samples.append(Sample(job, event, at, seen, min(let_go, seen)))
    return samples


def outliers(samples: list[Sample], hook_log: Path, service_log: str) -> list[dict[str, Any]]:
    """The samples over the target, each with what the hook and the service said about it:
    when the hook posted (or failed to), relative to the sample's start, and the service's
    warnings within its window."""
    posts: dict[str, list[str]] = {}
    if hook_log.exists():  # "<epoch> <context> job=<id> posted|failed"
        for line in hook_log.read_text().splitlines():
            stamp, context, job, result = line.split()
            posts.setdefault(job.removeprefix("job="), []).append(f"{context} {result} @{stamp}")
    found = []
    for sample in samples:
        if sample.seconds - sample.slurm_seconds <= TARGET_S:  # stale only once Slurm let go
            continue
        hook = [
            f"{p.split(' @')[0]} at {float(p.split(' @')[1]) - sample.at:+.3f}s"
            for p in posts.get(sample.job, [])
        ]
        found.append(
            {
                "job": sample.job,
                "event": sample.event,
                "seconds": sample.seconds,
                "slurm_let_go_s": sample.slurm_seconds,
                "hook": hook,
                "service_warnings": [
                    line
                    for line in service_log.splitlines()
                    if ("WARNING" in line or "ERROR" in line) and f" {sample.job}" in line
                ][:5],
            }
        )
    return found


def seconds(samples: list[float]) -> dict[str, float]:
    return summary(samples, digits=3, spread=True)


def wait_registered(url: str, names: list[str], timeout: float) -> bool:
    """Whether the sync registered these Slurm nodes in the ledger within ``timeout``."""
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=url, timeout=60) as client:
        while time.monotonic() < deadline:
            if all(client.get(f"/v1/nodes/{n}").status_code == 200 for n in names):
                return True
            time.sleep(1)
    return False


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=15000)
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--staleness-jobs", type=int, default=3)
    parser.add_argument(
        "--database-url",
        help="a PostgreSQL server (postgresql://user@host/db): a new database on it "
        "(default: a SQLite file)",
    )
    parser.add_argument(
        "--no-hints", dest="hints", action="store_false", help="poll only (no job hints)"
    )
    return parser


def fill_cluster(slurm: SlurmCluster, args: argparse.Namespace) -> dict[str, Any]:
    """The held jobs, the never-registering nodes' counts and two running jobs."""
    result: dict[str, Any] = {
        "slurm": f"{slurm.release} (real slurmctld + slurmrestd {API}, JWT)",
        "nodes": args.nodes + len(slurm.nodes),
        "jobs_submitted_per_s": round(slurm.submit_held(args.jobs, "scale"), 1),
    }
    size_scale_nodes(slurm, args.nodes)
    running = [
        slurm.sbatch("-w", n, "-c", "2", "--mem=500", "--wrap", "sleep 3600") for n in ("n1", "n2")
    ]
    result["jobs"] = args.jobs + len(running)
    return result


def size_scale_nodes(slurm: SlurmCluster, nodes: int) -> None:
    """Give s1..sN the counts node_features/k8s_resources gives a node when it registers
    (these never do; 26.05 sizes no node at slurmctld start): else the service's first pass
    pushes every one of them, minutes of work at 15,000 nodes that no real site sees."""
    slurm.update_nodes(f"s[1-{nodes}]", gres="k8scpu:16,k8smemory:32000")


@contextlib.contextmanager
def scale_cluster(
    nodes: int,
    rundir: str,
    port_base: int,
    *,
    cache: Path = CACHE,
    live: int = 3,
    keep: bool = False,
) -> Iterator[SlurmCluster]:
    """A real 26.05 cluster of its own whose slurm.conf also defines ``nodes`` nodes
    s1..sN that never register (cluster.sh's scale nodes) beside ``live`` nodes n1..
    with a slurmd: its own copy of the test cluster's chroot in ``cache``, run directory
    and ports; taken down after unless ``keep``."""
    env = {**scale_env(nodes, cache, rundir, port_base), "NODELEDGER_SLURM_NODES": str(live)}
    seed_cache(VERSION, cache, main=MAIN_CACHE)
    cluster_sh(VERSION, "up", timeout=1800, env=env)
    try:
        yield SlurmCluster.from_env(VERSION, env)
    finally:
        if not keep:
            cluster_sh(VERSION, "down", timeout=300, check=False, env=env)


def floors(slurm: SlurmCluster, samples: int) -> dict[str, Any]:
    """One node's raw update and read straight to slurmrestd."""
    raw = raw_updates(slurm, "n2", samples)
    with httpx.Client(base_url=slurm.url, timeout=30) as client:
        headers = {"X-SLURM-USER-NAME": slurm.user, "X-SLURM-USER-TOKEN": slurm.token}
        reads = [
            timed(lambda: client.get(f"/slurm/{API}/node/n2", headers=headers).raise_for_status())
            for _ in range(samples)
        ]
    return {
        "raw_node_update_ms": summary(raw),
        "node_read_ms": summary(reads),
    }


def service_env(slurm: SlurmCluster, hints: bool) -> dict[str, str]:
    env = {
        **slurm.service_env,
        "NODELEDGER_SLURM_REGISTER_NODES": "true",  # every Slurm node into the ledger
        "NODELEDGER_SLURM_TIMEOUT": "120",  # a full listing at this size takes long
    }
    if hints:
        env["NODELEDGER_SLURM_FULL_SYNC_INTERVAL"] = "600"
    return env


def through_service(service: ServiceProcess, samples: int, raw_p50: float) -> dict[str, Any]:
    """Admissions through the service next to the raw update's p50."""
    admit_ms, release_ms, rate = admissions(service.url, samples)
    admission = summary(admit_ms)
    return {
        "admission_ms": admission,
        "release_ms": summary(release_ms),
        "admission_to_raw_update_p50": round(admission["p50"] / raw_p50, 2),
        "admissions_per_s": round(rate, 1),
    }


def hinted(service: ServiceProcess, slurm: SlurmCluster, jobs: int) -> dict[str, Any]:
    """Staleness with job hints: slurmctld's hook posts to the service."""
    assert slurm.hint_config is not None
    # The hook's own log, inside the chroot: when each hint was posted.
    hook_log = slurm.hint_config.parents[2] / "tmp" / "nodeledger-hint.log"
    hook_log.unlink(missing_ok=True)
    slurm.hint_config.write_text(f"url={service.url}\ntimeout=2\nlog=/tmp/{hook_log.name}\n")
    samples = hinted_staleness(service.url, slurm, jobs, limit=300)
    result = {
        key: seconds([s.seconds for s in samples if s.event == event])
        for event, key in (("start", "staleness_s"), ("end", "release_staleness_s"))
    }
    ends = [s for s in samples if s.event == "end"]
    # Slurm holds a COMPLETING job's node: the ledger is stale only after.
    result["slurm_completing_s"] = seconds([s.slurm_seconds for s in ends])
    result["release_after_slurm_s"] = seconds([s.seconds - s.slurm_seconds for s in ends])
    return {**result, "staleness_outliers": outliers(samples, hook_log, service.log())}


def service_figures(service: ServiceProcess) -> dict[str, Any]:
    """Its idle CPU, RSS and metrics, once everything above is done."""
    pid = service.process.pid
    idle = CpuWindow(pid).start()
    time.sleep(IDLE_S)
    return {
        "service": {
            f"idle_cpu_percent_{IDLE_S}s": idle.percent(),
            "rss_mb": round(rss_mb(pid)),
            # Since start: every node registered and the first full listings read.
            "peak_rss_mb": round(peak_rss_mb(pid)),
        },
        "service_metrics": [
            line
            for line in httpx.get(f"{service.url}/metrics").text.splitlines()
            if line.startswith(METRICS) and "_bucket" not in line
        ],
    }


def measure(slurm: SlurmCluster, args: argparse.Namespace) -> dict[str, Any]:
    result = fill_cluster(slurm, args)
    result.update(floors(slurm, args.samples))
    result["job_hints"] = args.hints
    result["database"] = "postgresql" if args.database_url else "sqlite"
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        database = (
            stack.enter_context(postgres_database(args.database_url))
            if args.database_url
            else migrated(f"sqlite:///{tmp}/bench.db")
        )
        t0 = time.monotonic()
        env = service_env(slurm, args.hints)
        with running_service(database, Path(tmp), env=env, ready_timeout=900) as service:
            names = ["n1", "n2", "n3", f"s{args.nodes}"]
            result["nodes_registered"] = wait_registered(service.url, names, 900)
            result["startup_to_all_nodes_registered_s"] = round(time.monotonic() - t0, 1)
            raw_p50 = result["raw_node_update_ms"]["p50"]
            result.update(through_service(service, args.samples, raw_p50))
            if args.hints:
                result.update(hinted(service, slurm, args.staleness_jobs))
            else:
                stale = staleness(service.url, slurm, args.staleness_jobs, limit=300, runtime=600)
                result["staleness_s"] = seconds(stale)
            result.update(service_figures(service))
            shutil.copy(service.log_path, SERVICE_LOG)  # for a look at what it did
    result["cluster_wide_reads"] = cluster_wide_reads(slurm)
    return result


def main(argv: Sequence[str] | None = None) -> None:
    args = arguments().parse_args(argv)
    # cluster.sh (and so cluster_sh) points at the scale cluster from here on.
    os.environ.update(scale_env(args.nodes, CACHE, "/tmp/nodeledger-scale", 17400))
    with scale_cluster(args.nodes, "/tmp/nodeledger-scale", 17400) as slurm:
        result = measure(slurm, args)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
