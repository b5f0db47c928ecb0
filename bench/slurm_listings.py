"""What one cluster-wide slurmrestd listing costs the service at a site's size: 15,003 nodes
and 20,000 jobs (three in four running), replicated from what the 26.05 test cluster's
slurmrestd (v0.0.45) answers for its nodes and for a running and a pending job, and served
from memory by a local HTTP server, so only the reading side is measured.

Each figure comes from a fresh process: the service's client (``SlurmClient.get_nodes`` /
``get_jobs``: the body read into one buffer, decoded by msgspec into the fields the service
reads) and, for comparison, what it did before (``Response.json()`` on the whole answer,
then the same parse). Prints one JSON object: body size, CPU and wall seconds, peak RSS and
its growth over the process's own start.

    python -m bench.slurm_listings [--nodes 15003] [--jobs 20000]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from app.slurm import payloads
from app.slurm.client import SlurmClient
from app.slurm.tokens import StaticToken
from bench._fixtures import SlurmCluster, cluster_sh, wait_until
from bench.kubescale.proc import peak_rss_mb

REPO = Path(__file__).resolve().parent.parent

VERSION = "26.05"
API = "v0.0.45"


def sample_answers(slurm: SlurmCluster) -> dict[str, Any]:
    """The real answers to replicate: every node, one running and one pending job."""
    slurm.reset()
    running = slurm.sbatch("-w", "n1", "-c", "2", "--mem=500", "--wrap", "sleep 600")
    slurm.sbatch("-H", "-c", "2", "--mem=500", "--wrap", "sleep 600")
    wait_until(lambda: slurm.job_state(running) == "RUNNING", 30, what="a running job")
    headers = {"X-SLURM-USER-NAME": slurm.user, "X-SLURM-USER-TOKEN": slurm.token}
    try:
        return {
            kind: httpx.get(f"{slurm.url}/slurm/{API}/{kind}/", headers=headers).json()
            for kind in ("jobs", "nodes")
        }
    finally:
        slurm.reset()


def site_sized(answers: dict[str, Any], nodes: int, jobs: int) -> dict[str, bytes]:
    """The answers grown to ``nodes`` nodes and ``jobs`` jobs, as slurmrestd's JSON."""
    node_answer, job_answer = copy.deepcopy(answers["nodes"]), copy.deepcopy(answers["jobs"])
    template = node_answer["nodes"][0]
    node_answer["nodes"] = [{**template, "name": f"s{i}"} for i in range(nodes)]
    running = next(j for j in job_answer["jobs"] if j["job_resources"])
    pending = next(j for j in job_answer["jobs"] if not j["job_resources"])
    grown = []
    for i in range(jobs):
        job = copy.deepcopy(running if i % 4 else pending)
        job["job_id"] = 100 + i
        if job["job_resources"]:
            job["job_resources"]["nodes"]["allocation"][0]["name"] = f"s{i % nodes}"
        grown.append(job)
    job_answer["jobs"] = grown
    return {
        f"/slurm/{API}/nodes/": json.dumps(node_answer, indent=1).encode(),
        f"/slurm/{API}/jobs/": json.dumps(job_answer, indent=1).encode(),
        "/openapi/v3": json.dumps({"paths": {f"/slurm/{API}/nodes/": {}}}).encode(),
    }


def serve(bodies: dict[str, bytes]) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = bodies.get(self.path.split("?")[0])
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def measure(url: str, kind: str, way: str) -> dict[str, Any]:
    """In this process: read one listing ``way`` ("client" or "json")."""
    start_rss = peak_rss_mb(os.getpid())
    cpu, wall = time.process_time(), time.perf_counter()
    if way == "client":
        client = SlurmClient(url, StaticToken("bench"), timeout=300)
        listing = client.get_jobs() if kind == "jobs" else client.get_nodes()
        assert listing is not None
        count = len(listing.items)
    else:
        body = httpx.get(f"{url}/slurm/{API}/{kind}/", timeout=300).json()
        parse = payloads.parse_job if kind == "jobs" else payloads.parse_node
        count = len(tuple(parse(item) for item in body[kind]))
    peak = peak_rss_mb(os.getpid())
    return {
        "items": count,
        "cpu_s": round(time.process_time() - cpu, 2),
        "wall_s": round(time.perf_counter() - wall, 2),
        "peak_rss_mb": round(peak),  # VmHWM: ru_maxrss would keep the parent's across exec
        "rss_growth_mb": round(peak - start_rss),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=15003)
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument(
        "--measure", nargs=3, metavar=("URL", "KIND", "WAY"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.measure:  # the child process
        print(json.dumps(measure(*args.measure)))
        return
    cluster_sh(VERSION, "up", timeout=1800)
    bodies = site_sized(sample_answers(SlurmCluster.from_env(VERSION)), args.nodes, args.jobs)
    server = serve(bodies)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    result: dict[str, Any] = {"slurm": f"{VERSION} ({API}), answers replicated"}
    try:
        for kind in ("nodes", "jobs"):
            figures: dict[str, Any] = {"mb": round(len(bodies[f"/slurm/{API}/{kind}/"]) / 1e6, 1)}
            for way in ("client", "json"):
                child = [sys.executable, "-m", "bench.slurm_listings", "--measure", url, kind, way]
                out = subprocess.run(child, cwd=REPO, capture_output=True, text=True, check=True)
                figures[way] = json.loads(out.stdout)
            result[kind] = figures
    finally:
        server.shutdown()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
