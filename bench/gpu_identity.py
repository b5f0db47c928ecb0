"""GPU identity (issue 23) in one run against a real Slurm cluster: what a GPU pod's
admission costs with its device held in Slurm by a hold job ("identified") and with the GPU
only counted ("counted"), and whether a Slurm GPU job starts later beside held devices.

One `nodeledger serve` (SQLite, Slurm integration on, no headroom) with one node, gpu-1,
that is Slurm's n3 (16 CPUs, 32000 MB, four GPUs as the per-device GRES types g0..g3).
Both sides run in the same process, turn about, so a slow moment of the shared machine
falls on both alike. Prints one JSON object; latencies are p50/p99 in ms:

- raw_node_update_ms: one POST /node/{name} straight to slurmrestd, on n1 (the floor,
  interleaved with the admissions);
- admission: POST /v1/admissions of a pod asking cpu 1, memory 1Gi, gpu 1 on gpu-1, then
  DELETE of it, one after the other; ``identified`` names its device (``devices: [i]``,
  i taking turns over the four, a device reused no sooner than 1 s after its release): the
  gate's one Slurm call is the hold job (POST /job/allocate), and the release cancels it
  and updates the node (two calls); ``counted`` names none: the push of the lowered
  ``k8sgpu`` with its read-back, and the release pushes the counts back. The paths are
  interleaved round by round in a rotating order; each figure has its ratio to the raw
  update's p50; ``refused``: admissions answered other than 201 (none expected);
- job_start: a GPU job, ``sbatch -w n3 --gres=gpu:1 -c 1 --mem=100 --wrap "sleep 1"``,
  beside ``--held`` pods on gpu-1: ``feature``, each pod identified (devices 0, 1, ...
  held by hold jobs); ``counted``, the same number of pods counted only (k8sgpu lowered).
  Per round and side: the pods admitted, ``--settle`` s, then ``--jobs-per-round`` jobs
  one after the other, each cancelled once it runs and gone before the next, then the pods
  released and their holds gone. Sides alternate first and second by round. Each job is
  submitted at a set phase of the wall-clock second, the same phases for both sides in a
  round (spread by the golden ratio over the rounds): slurmctld starts a queued job in its
  once-a-second scheduling pass (the test cluster's log shows allocations at x.000-x.005 s),
  so the phase alone moves a start by up to a second; pairing the phases leaves the
  difference the feature makes. Figures per side:
  - start_ms: from just before ``sbatch`` (cluster.sh exec) to the job first seen RUNNING
    through slurmrestd (GET /job/{id}, polled every ``--poll-ms``): what a user sees;
  - submit_to_allocate_ms: slurmctld's own, from its log (ms timestamps): the submit RPC
    (``_slurm_rpc_submit_batch_job``) to ``sched: Allocate`` (the main scheduler) or
    ``_start_job: Started`` (backfill, every 5 s here: it starts some of them);
  - allocate_after_second_ms: how far past the whole second that allocation was logged:
    the scheduling pass's work before it started the job (where more jobs on the node, the
    hold jobs, could show);
  - sbatch_ms: the sbatch command alone (its process, the RPC, the answer);
  - devices: which device each job got (from its ``gres_detail``);
    ``jobs_on_a_held_device`` must be 0 with the feature;
  and ``compare``: feature/counted ratios of the p50s and p99s, the median and mean of the
  paired differences (same round, same phase) and how many pairs differ by more than
  100 ms either way (a job that missed a scheduling pass the other caught, or that
  backfill started early: a p50 moves by ~17 ms a rank with 60 jobs spread over a second),
  and the issue's criterion (a GPU job's start latency rises by no more than 10% with the
  feature) on start_ms's p50;
- load_average: the host's at the start, per round (max) and at the end: the two cores are
  shared with whatever else runs.

    python -m bench.gpu_identity [--slurm 24.11|26.05] [--rounds 12] [--samples 120]
        [--held 2] [--jobs-per-round 3] [--own-cluster DIR]

Without ``--own-cluster`` it uses (and resets: every job cancelled) the test cluster of
that release, as the other benches do: run it while no tests use that cluster. With
``--own-cluster DIR`` it runs a cluster of its own beside the test clusters (the built
chroot copied into DIR/cache once; ports from 19400 for 24.11, 19600 for 26.05), and
stops it at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from bench.admission_paths import interleaved
from bench.headroom import ms_summary, raw_updates
from bench.slurm_admission import summary
from tests.support.databases import migrated
from tests.support.realenv import wait_until
from tests.support.service import running_service
from tests.support.slurm_cluster import REST_API, SlurmCluster, cluster_sh, seed_cache

NODE = "gpu-1"  # the ledger's node; Slurm's n3 with the four GPUs
SLURM_NODE = "n3"
RAW_NODE = "n1"  # raw updates here: no pod or job there
GPUS = 4
NODE_BODY = {
    "capacity": {"cpu": "16", "memory": "32000Mi", "gpu": GPUS},
    "slurm_name": SLURM_NODE,
}
POD_CPU, POD_MEMORY = "1", "1Gi"
JOB_ARGS = ("-w", SLURM_NODE, "--gres=gpu:1", "-c", "1", "--mem=100", "--wrap", "sleep 1")
JOB_NAME = "gpu-start"
SIDES = ("feature", "counted")
REUSE_AFTER_S = 1.0  # a device's next identified admission no sooner after its release
GOLDEN = 0.6180339887498949
PORT_BASES = {"24.11": 19400, "25.11": 19500, "26.05": 19600}
BUSY = {"RUNNING", "COMPLETING", "PENDING", "CONFIGURING", "SUSPENDED"}


# ---------------------------------------------------------------------------- helpers


def gpu_indices(gres_detail: str) -> set[int]:
    """The GPU device indices in one node's ``gres_detail`` entry:
    ``gpu:g0:0(IDX:),gpu:g1:1(IDX:1),k8scpu(CNT:2)`` or ``gpu:1(IDX:0-1)``."""
    found: set[int] = set()
    for spec in re.findall(r"gpu[^(]*\(IDX:([^)]*)\)", gres_detail):
        for part in filter(None, spec.split(",")):
            low, _, high = part.partition("-")
            if low.isdigit():
                found.update(range(int(low), int(high or low) + 1))
    return found


def states(job: dict[str, Any]) -> set[str]:
    state = job.get("job_state", [])
    return set(state) if isinstance(state, list) else {str(state)}


def pod_body(uid: str, devices: list[int] | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "node": NODE,
        "holder": {"kind": "pod", "namespace": "bench", "name": uid, "uid": uid},
        "requests": {"cpu": POD_CPU, "memory": POD_MEMORY, "gpu": len(devices or [0])},
    }
    if devices is not None:
        body["devices"] = [{"index": d} for d in devices]
    return body


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


# ---------------------------------------------------------------------------- the pods


@dataclass
class Pods:
    """GPU pods admitted and released through the service, each call timed."""

    client: httpx.Client
    count: int = 0
    refused: list[str] = field(default_factory=list)
    released_at: dict[int, float] = field(default_factory=dict)  # device -> monotonic

    def admit(self, devices: list[int] | None) -> tuple[str | None, float]:
        """The pod's uid (None when refused) and the admission's ms."""
        uid = f"gpu-pod-{self.count}"
        self.count += 1
        t0 = time.perf_counter()
        response = self.client.post("/v1/admissions", json=pod_body(uid, devices))
        ms = (time.perf_counter() - t0) * 1000
        if response.status_code != 201:
            self.refused.append(f"{response.status_code} {response.text[:300]}")
            return None, ms
        return uid, ms

    def release(self, uid: str, devices: list[int] | None = None) -> float:
        t0 = time.perf_counter()
        self.client.delete(f"/v1/admissions/{uid}").raise_for_status()
        ms = (time.perf_counter() - t0) * 1000
        for device in devices or []:
            self.released_at[device] = time.monotonic()
        return ms

    def free_device(self) -> int:
        """The device released longest ago, once REUSE_AFTER_S has passed (waited for
        untimed): a freed device is held by a COMPLETING hold for a while on 24.11."""
        device = min(range(GPUS), key=lambda d: self.released_at.get(d, 0.0))
        wait = self.released_at.get(device, -1e9) + REUSE_AFTER_S - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        return device

    def identified(self, n: int) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {"admission_ms": [], "release_ms": [], "refused_ms": []}
        for _ in range(n):
            device = self.free_device()
            uid, ms = self.admit([device])
            if uid is None:
                out["refused_ms"].append(ms)
                self.released_at[device] = time.monotonic()
                continue
            out["admission_ms"].append(ms)
            out["release_ms"].append(self.release(uid, [device]))
        return out

    def counted(self, n: int) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {"admission_ms": [], "release_ms": [], "refused_ms": []}
        for _ in range(n):
            uid, ms = self.admit(None)
            if uid is None:
                out["refused_ms"].append(ms)
                continue
            out["admission_ms"].append(ms)
            out["release_ms"].append(self.release(uid))
        return out


# ---------------------------------------------------------------------------- Slurm


class Rest:
    """slurmrestd as SlurmUser, one kept connection (polling costs a request, not a
    connection, each time)."""

    def __init__(self, slurm: SlurmCluster) -> None:
        headers = {"X-SLURM-USER-NAME": slurm.user, "X-SLURM-USER-TOKEN": slurm.token}
        self.client = httpx.Client(
            base_url=f"{slurm.url}/slurm/{REST_API}/", headers=headers, timeout=10
        )

    def job(self, job_id: str) -> dict[str, Any]:
        jobs: list[dict[str, Any]] = self.client.get(f"job/{job_id}").json()["jobs"]
        return jobs[0]

    def busy_on_node(self) -> list[str]:
        """Jobs on n3 that hold or want it (hold jobs included): ``id name state``."""
        jobs = self.client.get("jobs/").json()["jobs"]
        return [
            f"{j['job_id']} {j['name']} {'+'.join(sorted(states(j)))}"
            for j in jobs
            if states(j) & BUSY and SLURM_NODE in (j.get("nodes") or j.get("required_nodes") or "")
        ]

    def cancel(self, job_id: str) -> None:
        self.client.delete(f"job/{job_id}").raise_for_status()


def quiet(rest: Rest, what: str) -> None:
    """No job on n3 holding or waiting (30 s at most)."""
    wait_until(lambda: not rest.busy_on_node(), 30, interval=0.02, what=what)


def wait_phase(phase: float) -> None:
    """Sleep until the wall clock's fraction of a second is ``phase``."""
    time.sleep((phase - time.time() % 1) % 1)


def start_job(slurm: SlurmCluster, rest: Rest, phase: float, poll_s: float) -> dict[str, Any]:
    """One GPU job submitted at ``phase`` of a second: until it is RUNNING, then cancelled
    and gone (not even COMPLETING) before this returns."""
    wait_phase(phase)
    t0 = time.perf_counter()
    job_id = slurm.sbatch("-J", JOB_NAME, *JOB_ARGS)
    sbatch_ms = (time.perf_counter() - t0) * 1000
    while True:
        job = rest.job(job_id)
        now = time.perf_counter()
        if "RUNNING" in states(job):
            break
        if not states(job) & BUSY or now - t0 > 30:
            raise RuntimeError(f"job {job_id} did not start: {job.get('job_state')}")
        time.sleep(poll_s)
    start_ms = (now - t0) * 1000
    detail = job.get("gres_detail") or []
    if not detail:  # not yet in the first listing: read once more
        detail = rest.job(job_id).get("gres_detail") or []
    rest.cancel(job_id)
    wait_until(
        lambda: not states(rest.job(job_id)) & BUSY, 30, interval=0.02, what=f"{job_id} gone"
    )
    return {
        "job": job_id,
        "phase": round(phase, 3),
        "start_ms": start_ms,
        "sbatch_ms": sbatch_ms,
        "devices": sorted(gpu_indices(detail[0])) if detail else None,
    }


LOG_LINE = re.compile(
    r"^\[(?P<at>[0-9T:.-]+)\] (?P<what>_slurm_rpc_submit_batch_job:|sched: Allocate|"
    r"sched/backfill: _start_job: Started|backfill: Started) JobId=(?P<job>\d+)\b"
)


def slurmctld_times(log: Path) -> dict[str, dict[str, datetime]]:
    """By job id: when slurmctld logged its submit and its allocation (ms resolution)."""
    times: dict[str, dict[str, datetime]] = {}
    for line in log.read_text(errors="replace").splitlines():
        if found := LOG_LINE.match(line):
            what = "submit" if found["what"].startswith("_slurm") else "allocate"
            times.setdefault(found["job"], {})[what] = datetime.fromisoformat(found["at"])
    return times


# ---------------------------------------------------------------------------- the cluster


@contextmanager
def cluster(version: str, own: Path | None) -> Iterator[tuple[SlurmCluster, Path]]:
    """The cluster and its slurmctld log (on the host). ``own``: a cluster of its own under
    that directory, stopped afterwards."""
    env: dict[str, str] = {}
    if own is not None:
        seed_cache(version, own / "cache")
        env = {
            "NODELEDGER_CACHE": str(own / "cache"),
            "NODELEDGER_RUNDIR": str(own / "run"),
            "NODELEDGER_SLURM_PORT_BASE": str(PORT_BASES[version]),
        }
    cluster_sh(version, "up", timeout=1800, env=env)
    try:
        slurm = SlurmCluster.from_env(version, script_env=env)
        exports = dict(re.findall(r"^export (\w+)=(.*)$", slurm.script("env"), re.MULTILINE))
        yield slurm, Path(exports["SLURM_RUNDIR"]) / "log" / "slurmctld.log"
    finally:
        if own is not None:
            cluster_sh(version, "down", env=env, check=False)


@contextmanager
def service(slurm: SlurmCluster) -> Iterator[httpx.Client]:
    env = {
        **slurm.service_env,
    }
    with tempfile.TemporaryDirectory() as tmp:
        database = migrated(f"sqlite:///{tmp}/gpu.db")
        with (
            running_service(database, Path(tmp), env=env, name="gpu") as process,
            httpx.Client(base_url=process.url, timeout=30) as client,
        ):
            client.put(f"/v1/nodes/{NODE}", json=NODE_BODY).raise_for_status()
            yield client


# ---------------------------------------------------------------------------- job starts


def job_rounds(
    slurm: SlurmCluster, rest: Rest, pods: Pods, args: argparse.Namespace
) -> tuple[dict[str, list[dict[str, Any]]], list[list[float]]]:
    """Every job's figures by side, and the load average at each round's start."""
    jobs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    loads = []
    per = args.jobs_per_round
    for r in range(args.rounds):
        loads.append(load())
        phases = [(0.05 + (r * per + j) * GOLDEN) % 1 for j in range(per)]
        for side in SIDES if r % 2 == 0 else SIDES[::-1]:
            held: list[tuple[str, list[int] | None]] = []
            for device in range(args.held):
                devices = [device] if side == "feature" else None
                uid, _ = pods.admit(devices)
                if uid is None:
                    raise RuntimeError(f"round {r} {side}: pod refused: {pods.refused[-1]}")
                held.append((uid, devices))
            time.sleep(args.settle)
            for j, phase in enumerate(phases):
                figures = start_job(slurm, rest, phase, args.poll_ms / 1000)
                jobs[side].append({"round": r, "slot": j, **figures})
            for uid, devices in held:
                pods.release(uid, devices)
            quiet(rest, f"round {r} {side}: the holds and jobs gone")
    return jobs, loads


def side_figures(
    jobs: list[dict[str, Any]], log: dict[str, dict[str, datetime]], held: set[int]
) -> dict[str, Any]:
    to_allocate, after_second = [], []
    for job in jobs:
        seen = log.get(job["job"], {})
        if "submit" in seen and "allocate" in seen:
            to_allocate.append((seen["allocate"] - seen["submit"]).total_seconds() * 1000)
            after_second.append(seen["allocate"].microsecond / 1000)
            job["submit_to_allocate_ms"] = to_allocate[-1]
    devices = Counter(",".join(map(str, j["devices"])) if j["devices"] else "?" for j in jobs)
    return {
        "start_ms": summary([j["start_ms"] for j in jobs]),
        "submit_to_allocate_ms": summary(to_allocate) if to_allocate else {"n": 0},
        "allocate_after_second_ms": summary(after_second) if after_second else {"n": 0},
        "sbatch_ms": summary([j["sbatch_ms"] for j in jobs]),
        "devices": dict(sorted(devices.items())),
        "jobs_on_a_held_device": sum(1 for j in jobs if set(j["devices"] or ()) & held),
    }


def compare(jobs: dict[str, list[dict[str, Any]]], figures: dict[str, Any]) -> dict[str, Any]:
    """Feature against counted: ratios and paired differences (same round, same slot)."""
    out: dict[str, Any] = {}
    for key in ("start_ms", "submit_to_allocate_ms"):
        f, c = figures["feature"][key], figures["counted"][key]
        pairs = {(j["round"], j["slot"]): j[key] for j in jobs["counted"] if key in j}
        diffs = [
            j[key] - pairs[(j["round"], j["slot"])]
            for j in jobs["feature"]
            if key in j and (j["round"], j["slot"]) in pairs
        ]
        out[key] = {
            "p50_ratio": ratio(f.get("p50", 0), c.get("p50", 0)),
            "p99_ratio": ratio(f.get("p99", 0), c.get("p99", 0)),
            "paired_diff_ms": {
                "median": round(statistics.median(diffs), 1),
                "mean": round(statistics.fmean(diffs), 1),
                "n": len(diffs),
                "feature_later_by_over_100": sum(1 for d in diffs if d > 100),
                "feature_earlier_by_over_100": sum(1 for d in diffs if d < -100),
            }
            if diffs
            else {"n": 0},
        }
    measured = out["start_ms"]["p50_ratio"]
    out["criterion"] = {
        "what": "a GPU job's start latency (start_ms p50) rises by no more than 10% with the "
        "feature",
        "max_ratio": 1.1,
        "measured_ratio": measured,
        "met": measured is not None and measured <= 1.1,
    }
    return out


# ---------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slurm", default="26.05", help="Slurm release of the test cluster")
    parser.add_argument("--rounds", type=int, default=12, help="interleaved rounds, both parts")
    parser.add_argument("--samples", type=int, default=120, help="admissions per path")
    parser.add_argument("--held", type=int, default=2, help="GPU pods beside each job (1-3)")
    parser.add_argument("--jobs-per-round", type=int, default=3, help="GPU jobs per side")
    parser.add_argument("--settle", type=float, default=1.0, help="s after the pods' admission")
    parser.add_argument("--poll-ms", type=float, default=10.0, help="job state polling")
    parser.add_argument("--own-cluster", type=Path, help="a cluster of its own under this dir")
    args = parser.parse_args()
    if not 1 <= args.held < GPUS:
        parser.error(f"--held {args.held}: 1 to {GPUS - 1} (a job needs a free device)")
    started = time.monotonic()
    load_start = load()
    with cluster(args.slurm, args.own_cluster) as (slurm, log_path):
        slurm.reset()
        rest = Rest(slurm)
        try:
            with service(slurm) as client:
                pods = Pods(client)
                # Unmeasured: connections, the API negotiation, the first sync.
                pods.identified(2)
                pods.counted(2)
                per_round = max(1, args.samples // args.rounds)
                samples = interleaved(
                    args.rounds,
                    per_round,
                    {
                        "raw": lambda n: {"ms": raw_updates(slurm, RAW_NODE, n)},
                        "identified": pods.identified,
                        "counted": pods.counted,
                    },
                )
                refused_admissions = list(pods.refused)
                quiet(rest, "the admissions' holds gone")
                jobs, loads = job_rounds(slurm, rest, pods, args)
        finally:
            rest.client.close()
            slurm.reset()
        log = slurmctld_times(log_path)
    raw = samples["raw"]["ms"]
    figures = {
        "feature": side_figures(jobs["feature"], log, set(range(args.held))),
        "counted": side_figures(jobs["counted"], log, set()),
    }
    result = {
        "slurm": f"{slurm.release} (real slurmctld + slurmrestd, JWT)",
        "cluster": "own (--own-cluster)" if args.own_cluster else "the test cluster",
        "database": "sqlite",
        "node": f"{NODE} = Slurm {SLURM_NODE}: 16 CPUs, 32000 MB, GPUs as GRES types g0..g3",
        "raw_node_update_ms": summary(raw),
        "admission": {
            "method": f"one client (httpx), a pod of cpu {POD_CPU}, memory {POD_MEMORY}, gpu 1 "
            f"admitted then released, {per_round} a round per path over {args.rounds} rounds "
            "in a rotating order with raw updates on n1; identified: devices [i], i in turn, "
            f"reused >= {REUSE_AFTER_S:g} s after its release",
            **{
                name: {
                    "admission_ms": ms_summary(samples[name].get("admission_ms", []), raw),
                    "release_ms": ms_summary(samples[name].get("release_ms", []), raw),
                    "refused": len(samples[name].get("refused_ms", [])),
                }
                for name in ("identified", "counted")
            },
            "identified_to_counted_p50": ratio(
                statistics.median(samples["identified"]["admission_ms"]),
                statistics.median(samples["counted"]["admission_ms"]),
            ),
            "refusals": refused_admissions[:3],
        },
        "job_start": {
            "method": f"sbatch {' '.join(JOB_ARGS[:-1])} 'sleep 1' beside {args.held} GPU "
            "pods (feature: identified on devices "
            f"{list(range(args.held))}, each a hold job; counted: k8sgpu lowered by "
            f"{args.held}); {args.jobs_per_round} jobs per side per round, {args.rounds} "
            f"rounds, sides alternating first; each job at a set phase of the second (the "
            f"same for both sides in a round), polled every {args.poll_ms:g} ms through "
            f"slurmrestd, cancelled once running; pods admitted {args.settle:g} s before",
            **figures,
            "compare": compare(jobs, figures),
        },
        "load_average": {
            "start": load_start,
            "rounds_max_1min": max(x[0] for x in loads),
            "end": load(),
        },
        "seconds": round(time.monotonic() - started, 1),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
