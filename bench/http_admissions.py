"""Admissions and releases through HTTP against real `nodeledger serve` processes.

Prints one JSON object: for each database (SQLite, PostgreSQL) and replica count (1, 2),
admissions per second and p50/p99 latency of admission and release. Each worker admits a
pod and releases it again, so the node never fills up and every request does real work.

    python -m bench.http_admissions [--seconds 10] [--concurrency 8] [--postgres-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.databases import migrated, postgres_database, postgres_server_url  # noqa: E402
from tests.support.service import running_service  # noqa: E402


def percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


async def drive(urls: list[str], seconds: float, concurrency: int) -> dict[str, Any]:
    admit_ms: list[float] = []
    release_ms: list[float] = []
    errors: dict[str, int] = {}
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=64)) as client:
        await client.put(
            f"{urls[0]}/v1/nodes/bench", json={"capacity": {"cpu": "1000", "memory": "4Ti"}}
        )
        stop = time.perf_counter() + seconds

        async def worker(w: int) -> None:
            i = 0
            url = urls[w % len(urls)]
            while time.perf_counter() < stop:
                uid = f"w{w}-{i}"
                i += 1
                body = {
                    "node": "bench",
                    "holder": {"kind": "pod", "uid": uid},
                    "requests": {"cpu": "100m", "memory": "128Mi"},
                }
                t0 = time.perf_counter()
                r = await client.post(f"{url}/v1/admissions", json=body)
                admit_ms.append((time.perf_counter() - t0) * 1000)
                if r.status_code != 201:
                    errors[str(r.status_code)] = errors.get(str(r.status_code), 0) + 1
                    continue
                t0 = time.perf_counter()
                r = await client.delete(f"{url}/v1/admissions/{uid}")
                release_ms.append((time.perf_counter() - t0) * 1000)

        started = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        elapsed = time.perf_counter() - started
    return {
        "admissions_per_s": round(len(admit_ms) / elapsed, 1),
        "operations_per_s": round((len(admit_ms) + len(release_ms)) / elapsed, 1),
        "admit_p50_ms": round(statistics.median(admit_ms), 2),
        "admit_p99_ms": round(percentile(admit_ms, 99), 2),
        "release_p50_ms": round(statistics.median(release_ms), 2),
        "release_p99_ms": round(percentile(release_ms, 99), 2),
        "admissions": len(admit_ms),
        "errors": errors,
    }


def run_case(
    database_url: str, replicas: int, seconds: float, concurrency: int, log_dir: Path
) -> dict[str, Any]:
    with ExitStack() as stack:
        services = [
            stack.enter_context(running_service(database_url, log_dir, name=f"b{i}"))
            for i in range(replicas)
        ]
        return asyncio.run(drive([s.url for s in services], seconds, concurrency))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--postgres-url", default=os.environ.get("NODELEDGER_TEST_POSTGRES_URL"))
    parser.add_argument("--only", choices=["sqlite", "postgresql"])
    args = parser.parse_args()

    results: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "seconds": args.seconds,
        "concurrency": args.concurrency,
        "cases": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        log_dir = Path(tmp)
        if args.only in (None, "sqlite"):
            for replicas in (1, 2):
                url = migrated(f"sqlite:///{log_dir / f'bench{replicas}.db'}")
                results["cases"][f"sqlite/{replicas}"] = run_case(
                    url, replicas, args.seconds, args.concurrency, log_dir
                )
        if args.only in (None, "postgresql"):
            server = args.postgres_url or postgres_server_url()
            for replicas in (1, 2):
                with postgres_database(server) as url:
                    results["cases"][f"postgresql/{replicas}"] = run_case(
                        url, replicas, args.seconds, args.concurrency, log_dir
                    )
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
