"""The admission path through real slurmrestd, next to one raw slurmrestd node update
measured in the same run, and the Slurm -> ledger staleness.

Prints one JSON object:
- raw_node_update_ms: one POST /node/{name} straight to slurmrestd (the floor);
- admission_ms / release_ms: POST/DELETE /v1/admissions through `nodeledger serve`
  (hold, push the lowered counts, read the node back, confirm);
- admission_to_raw_update_p50: the ratio of the two p50s (the figure to watch);
- admissions_per_s: concurrent admissions over three nodes;
- staleness_s: from a job being RUNNING in Slurm to the ledger showing its holding
  (sync interval 1 s).

    python -m bench.slurm_admission [--samples 100] [--slurm 26.05]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import httpx

from bench._fixtures import SlurmCluster, cluster, pod, raw_updates, sqlite_services
from bench._stats import summary, timed

RAW_NODE = "n2"  # raw updates here; admissions on n1 (one after the other), n1-n3 (at once)


def admissions(url: str, samples: int) -> tuple[list[float], list[float], float]:
    admit_ms, release_ms = [], []
    with httpx.Client(base_url=url, timeout=30) as client:
        for i in range(samples):
            uid = f"seq-{i}"
            admit_ms.append(
                timed(
                    lambda u=uid: client.post(
                        "/v1/admissions", json=pod("n1", u)
                    ).raise_for_status()
                )
            )
            release_ms.append(
                timed(lambda u=uid: client.delete(f"/v1/admissions/{u}").raise_for_status())
            )

        def admit(i: int) -> None:
            client.post(
                "/v1/admissions", json=pod(("n1", "n2", "n3")[i % 3], f"par-{i}", "100m", "100Mi")
            ).raise_for_status()

        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=6) as pool:
            list(pool.map(admit, range(samples)))
        rate = samples / (time.perf_counter() - t0)
        for i in range(samples):
            client.delete(f"/v1/admissions/par-{i}")
    return admit_ms, release_ms, rate


def staleness(
    url: str, slurm: SlurmCluster, jobs: int, limit: float = float("inf"), runtime: int = 5
) -> list[float]:
    """Seconds from RUNNING in Slurm to the ledger's holding, per job of ``runtime`` seconds
    (it must outlive the wait); ``inf`` for a job the ledger had not shown after ``limit``."""
    seconds = []
    with httpx.Client(base_url=url, timeout=30) as client:
        for _ in range(jobs):
            job = slurm.sbatch("-w", "n3", "-c", "2", "--mem=100", "--wrap", f"sleep {runtime}")
            while slurm.job_state(job) != "RUNNING":
                time.sleep(0.02)
            running = time.monotonic()
            seen = float("inf")
            while time.monotonic() - running < limit:
                rows = client.get(
                    "/v1/holdings", params={"node": "n3", "holder_kind": "slurm_job"}
                ).json()
                if any(r["holder"]["id"] == job for r in rows):
                    seen = time.monotonic() - running
                    break
                time.sleep(0.02)
            seconds.append(seen)
            slurm.scancel(job)
    return seconds


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--jobs", type=int, default=10)
    parser.add_argument("--slurm", default="24.11", help="Slurm release of the test cluster")
    args = parser.parse_args(argv)
    slurm = cluster(args.slurm)
    slurm.reset()
    raw = raw_updates(slurm, RAW_NODE, args.samples)
    slurm.reset()
    env = {
        **slurm.service_env,
        "NODELEDGER_SLURM_REGISTER_NODES": "true",
    }
    with sqlite_services({"nodeledger": env}) as found:
        service = found["nodeledger"]
        with httpx.Client(base_url=service.url) as client:
            deadline = time.monotonic() + 30
            while len(client.get("/v1/nodes").json()) < 3 and time.monotonic() < deadline:
                time.sleep(0.1)
        admit_ms, release_ms, rate = admissions(service.url, args.samples)
        stale = staleness(service.url, slurm, args.jobs)
    slurm.reset()
    result = {
        "slurm": f"{slurm.release} (real slurmctld + slurmrestd, JWT)",
        "database": "sqlite",
        "raw_node_update_ms": summary(raw),
        "admission_ms": summary(admit_ms),
        "release_ms": summary(release_ms),
        "admission_to_raw_update_p50": round(
            statistics.median(admit_ms) / statistics.median(raw), 2
        ),
        "admissions_per_s": round(rate, 1),
        "staleness_s": summary(stale, digits=3, spread=True),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
