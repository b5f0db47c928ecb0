"""Ways to admit a pod, side by side in one run against a real Slurm cluster (issue 22:
"weigh one alternative first").

Prints one JSON object; every latency is p50/p99 in ms with its ratio to the raw node
update measured in the same run. The paths are interleaved round by round, so a slow
moment of the shared machine falls on all of them alike:

- raw_node_update_ms: one POST /node/{name} straight to slurmrestd (the floor);
- slurm_confirmed: POST/DELETE /v1/admissions through `nodeledger serve` with the Slurm
  integration on (hold, push the lowered counts, read the node back, confirm): today;
- ledger_only: the same calls to a second `nodeledger serve` with the integration off, one
  ledger transaction: what an admission inside a headroom would cost;
- slurm_hold: the per-pod hold in Slurm itself, POST /job/allocate with "immediate" and
  the EXTERNAL_JOB flag on the pod's node, released with DELETE /job/{id};
- ledger_then_hold: an admission by the ledger-only service followed by such a hold (and
  both released): the least a hold per pod costs once the ledger records the pod too;
- release_to_start_s: after a hold that fills a node is released, how long until a job
  waiting for its CPUs starts, without and with a no-op node update to wake the scheduler,
  and the same after a batch job that filled the node is cancelled (the yardstick);
- hold_while_job_pends: what "immediate" answers on a free node while that job pends,
  without and with the top priority in the request.

    python -m bench.admission_paths [--samples 300] [--rounds 10] [--trials 5] [--slurm 26.05]

Needs Slurm >= 25.05 (external jobs; slurmrestd v0.0.45 is 26.05's).
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import httpx

from bench._fixtures import (
    REST_API,
    SlurmCluster,
    cluster,
    pod,
    raw_updates,
    sqlite_services,
    wait_until,
)
from bench._stats import against, interleaved, summary, timed

HOLD_API = "v0.0.45"  # EXTERNAL_JOB is in slurmrestd's job flags from v0.0.44 on
HOLD_NODE = "n3"  # holds here; raw updates on n2 (as bench.slurm_admission), pods on n1
RAW_NODE = "n2"
FREE_NODE = "n2"  # the "immediate" probes while a job pends on HOLD_NODE
TOP_PRIORITY = 4294967293  # one below NO_VAL: what slurm-facts.md saw work; SlurmUser/root only
POD_CPUS, POD_MEMORY_MB = 1, 1024  # the pod's requests: cpu "1", memory "1Gi"


def hold_body(node: str, cpus: int, memory_mb: int, *, priority: bool = False) -> dict[str, Any]:
    """A job with no script that only holds ``cpus`` and ``memory_mb`` on ``node`` in Slurm's
    own accounting, now or never (slurm-facts.md: external jobs as holds)."""
    job: dict[str, Any] = {
        "name": "k8s-hold",
        "flags": ["EXTERNAL_JOB"],
        "immediate": True,
        "required_nodes": [node],
        "cpus_per_task": cpus,
        "memory_per_node": {"set": True, "number": memory_mb},
        "current_working_directory": "/tmp",
        "environment": ["PATH=/usr/bin:/bin"],
    }
    if priority:
        job["priority"] = {"set": True, "number": TOP_PRIORITY}
    return {"job": job}


def answer(response: httpx.Response) -> str:
    """HTTP status, and Slurm's error number when it refused: "200", "422/2016"."""
    if response.status_code == 200:
        return "200"
    errors = response.json().get("errors") or [{}]
    return f"{response.status_code}/{errors[0].get('error_number', '?')}"


class Holds:
    """Per-pod holds through slurmrestd (as SlurmUser: only it may set a priority)."""

    def __init__(self, slurm: SlurmCluster) -> None:
        headers = {"X-SLURM-USER-NAME": slurm.user, "X-SLURM-USER-TOKEN": slurm.token}
        self.rest = httpx.Client(base_url=f"{slurm.url}/slurm", headers=headers, timeout=30)
        self.answers: Counter[str] = Counter()  # of the measured holds

    def close(self) -> None:
        self.rest.close()

    def hold(
        self, node: str, cpus: int = POD_CPUS, memory_mb: int = POD_MEMORY_MB, **kw: bool
    ) -> tuple[httpx.Response, str | None]:
        """The answer and, when held, the job's id."""
        r = self.rest.post(f"/{HOLD_API}/job/allocate", json=hold_body(node, cpus, memory_mb, **kw))
        return r, str(r.json()["job_id"]) if r.status_code == 200 else None

    def release(self, job_id: str) -> None:
        self.rest.delete(f"/{HOLD_API}/job/{job_id}").raise_for_status()

    def wake(self, node: str) -> None:
        """A no-op node update: slurmctld schedules right after it."""
        self.rest.post(f"/{REST_API}/node/{node}", json={}).raise_for_status()

    def job(self, job_id: str) -> tuple[str, str]:
        """The job's state and reason."""
        job = self.rest.get(f"/{HOLD_API}/job/{job_id}").raise_for_status().json()["jobs"][0]
        return job["job_state"][0], job.get("state_reason", "")

    def submit(self, node: str, cpus: int) -> str:
        """A batch job of ``cpus`` on ``node`` that runs until cancelled."""
        body = {
            "job": {
                "name": "waiting",
                "required_nodes": [node],
                "cpus_per_task": cpus,
                "memory_per_node": {"set": True, "number": 100},
                "current_working_directory": "/tmp",
                "environment": ["PATH=/usr/bin:/bin"],
                "script": "#!/bin/sh\nsleep 600\n",
            }
        }
        r = self.rest.post(f"/{HOLD_API}/job/submit", json=body).raise_for_status()
        return str(r.json()["job_id"])

    def hold_when_free(self, node: str, cpus: int, memory_mb: int) -> str:
        """Hold as soon as an earlier job's resources are back (it may still be completing)."""
        job_id: str = wait_until(
            lambda: self.hold(node, cpus, memory_mb)[1] or "", 60, what=f"{cpus} CPUs free"
        )
        return job_id


def hold_release(holds: Holds, count: int) -> dict[str, list[float]]:
    """``count`` pod-sized holds on HOLD_NODE, each released before the next (a refused hold
    is timed too, as an admission would be; its answer is counted in ``holds.answers``)."""
    hold_ms, release_ms = [], []
    for _ in range(count):
        t0 = time.perf_counter()
        r, job_id = holds.hold(HOLD_NODE)
        hold_ms.append((time.perf_counter() - t0) * 1000)
        holds.answers[answer(r)] += 1
        if job_id is not None:
            release_ms.append(timed(lambda j=job_id: holds.release(j)))
    return {"hold_ms": hold_ms, "release_ms": release_ms}


def admit_release(
    url: str, prefix: str, count: int, holds: Holds | None = None
) -> dict[str, list[float]]:
    """``count`` pods admitted on n1 and released, one after the other. With ``holds``, each
    admission also takes a pod-sized hold in Slurm and its release drops it: the least a
    hold per pod would cost through the ledger (one ledger transaction and the hold; the
    real path would also confirm)."""
    admit_ms, release_ms = [], []
    with httpx.Client(base_url=url, timeout=30) as client:
        for i in range(count):
            uid = f"{prefix}-{i}"
            t0 = time.perf_counter()
            client.post("/v1/admissions", json=pod("n1", uid)).raise_for_status()
            job_id = holds.hold_when_free(HOLD_NODE, POD_CPUS, POD_MEMORY_MB) if holds else None
            admit_ms.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            if holds and job_id:
                holds.release(job_id)
            client.delete(f"/v1/admissions/{uid}").raise_for_status()
            release_ms.append((time.perf_counter() - t0) * 1000)
    return {"admission_ms": admit_ms, "release_ms": release_ms}


# A release-to-start trial's way of filling and freeing HOLD_NODE: (filled by a hold rather
# than a batch job, a no-op node update right after the release).
RELEASES = {
    "batch_job_cancelled": (False, False),  # the yardstick: what a finished job frees
    "hold_released": (True, False),
    "hold_released_then_node_update": (True, True),
}


def release_to_start(holds: Holds, how: str, delay: float) -> tuple[float, str, str]:
    """One trial: a job (RELEASES[how]) fills HOLD_NODE, a 2-CPU job waits for it; probe
    "immediate" on FREE_NODE meanwhile, without and with top priority; ``delay`` seconds
    after the job was seen pending, release the first (and wake the scheduler) and time the
    waiting job's start. Seconds, and the two probes' answers."""
    by_hold, wake = RELEASES[how]
    if by_hold:
        full = holds.hold_when_free(HOLD_NODE, 16, 1000)
    else:
        full = holds.submit(HOLD_NODE, 16)
        wait_until(lambda: holds.job(full)[0] == "RUNNING", 60, what="the node filled")
    waiting = holds.submit(HOLD_NODE, 2)
    wait_until(lambda: holds.job(waiting) == ("PENDING", "Resources"), 30, what="job pends")
    probes = [holds.hold(FREE_NODE), holds.hold(FREE_NODE, priority=True)]
    for _, job_id in probes:
        if job_id is not None:
            holds.release(job_id)
    time.sleep(delay)
    holds.release(full)
    released = time.monotonic()
    if wake:
        holds.wake(HOLD_NODE)
    while holds.job(waiting)[0] != "RUNNING":
        if time.monotonic() - released > 120:
            raise RuntimeError(f"job {waiting} did not start within 120 s of the release")
        time.sleep(0.01)
    seconds = time.monotonic() - released
    holds.release(waiting)
    return seconds, answer(probes[0][0]), answer(probes[1][0])


@contextmanager
def services(slurm: SlurmCluster) -> Iterator[tuple[str, str]]:
    """The Slurm-confirmed service and the ledger-only one, n1 (16 CPUs, 32000 MiB, Slurm's
    sizes) the only node of each, so nothing else the bench touches is theirs to push."""
    with sqlite_services({"confirmed": slurm.service_env, "ledger": {}}) as found:
        for process in found.values():
            body = {"capacity": {"cpu": "16", "memory": "32000Mi"}}
            httpx.put(f"{process.url}/v1/nodes/n1", json=body, timeout=30).raise_for_status()
        yield found["confirmed"].url, found["ledger"].url


def scheduler_parameters(slurm: SlurmCluster) -> str:
    config = slurm.run("scontrol", "show", "config")
    return next(
        (line.split("=", 1)[1].strip() for line in config.splitlines() if "SchedulerParam" in line),
        "",
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=300, help="per path")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--trials", type=int, default=5, help="release-to-start, each way")
    parser.add_argument("--slurm", default="26.05", help="Slurm release of the test cluster")
    args = parser.parse_args(argv)
    slurm = cluster(args.slurm)
    slurm.reset()
    scheduling = scheduler_parameters(slurm)
    found = re.search(r"bf_interval=(\d+)", scheduling)
    bf_interval = int(found.group(1)) if found else 30  # Slurm's default
    holds = Holds(slurm)
    try:
        with services(slurm) as (confirmed, ledger):
            # One unmeasured pass of each: connections, caches, the first sync.
            admit_release(confirmed, "warm-c", 3)
            admit_release(ledger, "warm-l", 3)
            hold_release(holds, 3)
            holds.answers.clear()
            rounds = iter(range(10**6))  # a fresh pod uid prefix per call
            samples = interleaved(
                args.rounds,
                max(1, args.samples // args.rounds),
                {
                    "raw": lambda n: {"ms": raw_updates(slurm, RAW_NODE, n)},
                    "slurm_confirmed": lambda n: admit_release(confirmed, f"c{next(rounds)}", n),
                    "ledger_only": lambda n: admit_release(ledger, f"l{next(rounds)}", n),
                    "slurm_hold": lambda n: hold_release(holds, n),
                    "ledger_then_hold": lambda n: admit_release(
                        ledger, f"h{next(rounds)}", n, holds
                    ),
                },
            )
        # Releases spread over one backfill interval and over one second (slurmctld's
        # background loop): the wait depends on where in them they fall.
        delays = [0.2 + i * (bf_interval + 1) / args.trials for i in range(args.trials)]
        trials = {how: [release_to_start(holds, how, d) for d in delays] for how in RELEASES}
    finally:
        holds.close()
        slurm.reset()
    raw = samples.pop("raw")["ms"]
    probes = [t for way in trials.values() for t in way]
    result = {
        "slurm": f"{slurm.release} (real slurmctld + slurmrestd, JWT)",
        "scheduler_parameters": scheduling,
        "database": "sqlite",
        "samples_per_path": len(raw),
        "rounds": args.rounds,
        "raw_node_update_ms": summary(raw),
        **{
            path: {key: against(values, raw) for key, values in got.items()}
            for path, got in samples.items()
        },
        "slurm_hold_answers": dict(holds.answers),
        "release_to_start_s": {
            way: summary([t[0] for t in got], digits=3, spread=True) for way, got in trials.items()
        },
        "hold_while_job_pends": {
            "plain": dict(Counter(t[1] for t in probes)),
            "top_priority": dict(Counter(t[2] for t in probes)),
        },
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
