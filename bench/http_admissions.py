"""Admissions and releases through HTTP against real `nodeledger serve` processes.

Prints one JSON object: for each database (SQLite, PostgreSQL) and replica count (1, 2),
admissions and releases per second and their p50/p99 latency. Each round fills 20 nodes
with 50 pods each, then releases them, so every request does real work on realistically
full nodes.

    python -m bench.http_admissions [--rounds 5] [--concurrency 4] [--postgres-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import aiohttp

from bench._fixtures import migrated, postgres_database, postgres_server_url, running_service
from bench._stats import percentile


async def drive(
    urls: list[str], rounds: int, concurrency: int, nodes: int, pods_per_node: int
) -> dict[str, Any]:
    """Each round admits `nodes * pods_per_node` pods spread over the nodes (as a
    scheduler would), then releases them all; the two phases are timed separately."""
    admit_ms: list[float] = []
    release_ms: list[float] = []
    admit_s = release_s = 0.0
    errors: dict[str, int] = {}
    # aiohttp: a quarter of httpx's CPU per request, which the server would otherwise lose
    # on a machine with two cores.
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as client:
        for n in range(nodes):
            body = {"capacity": {"cpu": "128", "memory": "1Ti"}}
            async with client.put(f"{urls[0]}/v1/nodes/bench-{n}", json=body) as response:
                response.raise_for_status()
        batch = nodes * pods_per_node

        async def call(
            method: str, path: str, body: Any, w: int, samples: list[float], expect: int
        ) -> None:
            t0 = time.perf_counter()
            async with client.request(method, f"{urls[w % len(urls)]}{path}", json=body) as r:
                await r.read()
            samples.append((time.perf_counter() - t0) * 1000)
            if r.status != expect:
                errors[str(r.status)] = errors.get(str(r.status), 0) + 1

        async def phase(
            jobs: list[tuple[str, str, Any]], samples: list[float], expect: int
        ) -> float:
            queue = list(reversed(jobs))

            async def worker(w: int) -> None:
                while queue:
                    method, path, body = queue.pop()
                    await call(method, path, body, w, samples, expect)

            t0 = time.perf_counter()
            await asyncio.gather(*(worker(w) for w in range(concurrency)))
            return time.perf_counter() - t0

        for r in range(rounds):
            uids = [f"r{r}-p{i}" for i in range(batch)]
            admit_s += await phase(
                [
                    (
                        "POST",
                        "/v1/admissions",
                        {
                            "node": f"bench-{i % nodes}",
                            "holder": {"kind": "pod", "uid": uid},
                            "requests": {"cpu": "250m", "memory": "512Mi"},
                        },
                    )
                    for i, uid in enumerate(uids)
                ],
                admit_ms,
                201,
            )
            release_s += await phase(
                [("DELETE", f"/v1/admissions/{uid}", None) for uid in uids], release_ms, 200
            )
    return {
        "admissions_per_s": round(len(admit_ms) / admit_s, 1),
        "admit_p50_ms": round(statistics.median(admit_ms), 2),
        "admit_p99_ms": round(percentile(admit_ms, 99), 2),
        "releases_per_s": round(len(release_ms) / release_s, 1),
        "release_p50_ms": round(statistics.median(release_ms), 2),
        "release_p99_ms": round(percentile(release_ms, 99), 2),
        "admissions": len(admit_ms),
        "errors": errors,
    }


def run_case(
    database_url: str, replicas: int, args: argparse.Namespace, log_dir: Path
) -> dict[str, Any]:
    with ExitStack() as stack:
        services = [
            stack.enter_context(running_service(database_url, log_dir, name=f"b{i}"))
            for i in range(replicas)
        ]
        return asyncio.run(
            drive(
                [s.url for s in services],
                args.rounds,
                args.concurrency,
                args.nodes,
                args.pods_per_node,
            )
        )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--pods-per-node", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--postgres-url", default=os.environ.get("NODELEDGER_TEST_POSTGRES_URL"))
    parser.add_argument("--only", choices=["sqlite", "postgresql"])
    args = parser.parse_args(argv)

    results: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "rounds": args.rounds,
        "nodes": args.nodes,
        "pods_per_node": args.pods_per_node,
        "concurrency": args.concurrency,
        "cases": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        log_dir = Path(tmp)
        if args.only in (None, "sqlite"):
            for replicas in (1, 2):
                url = migrated(f"sqlite:///{log_dir / f'bench{replicas}.db'}")
                results["cases"][f"sqlite/{replicas}"] = run_case(url, replicas, args, log_dir)
        if args.only in (None, "postgresql"):
            server = args.postgres_url or postgres_server_url()
            for replicas in (1, 2):
                with postgres_database(server) as url:
                    results["cases"][f"postgresql/{replicas}"] = run_case(
                        url, replicas, args, log_dir
                    )
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
