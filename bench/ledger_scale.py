"""The ledger at 100 / 1,000 / 15,000 nodes: what grows with the number of nodes.

For each size N, a fresh database gets N nodes with 10 pod holdings each (and an event per
row, as a real log would have), written in bulk (tests/support/bulk.py). Then:
- in-process: ``Extender.filter`` over 1,000 candidates (or all N when fewer), exactly
  what the HTTP route calls: alone, right after an admission, and while full reloads of
  the snapshot run; the time to load every node view (``Ledger.list_nodes`` and, where
  it exists, the snapshot's full load);
- over HTTP against a real ``nodeledger serve`` with the Kubernetes integration on (its
  API server unreachable: the extender's filter never calls it): filter and prioritize,
  admission and release, ``GET /v1/nodes/{name}``, one request at a time, and the
  service's RSS afterwards.
Prints one JSON object. Not run in CI.

    python -m bench.ledger_scale [--sizes 100,1000,15000] [--samples 200] [--budget 30]
        [--database-url postgresql://user@host/db]  # a server: a new database per size
        [--max-staleness 0.1]  # the extender's, in seconds (default 0: exact)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from fastapi.testclient import TestClient

from app.admission.service import AdmissionRequest, ReleaseRequest
from app.core.ledger_errors import AdmissionRejected, HoldingNotFound
from app.core.records import Holder, HolderKind
from app.core.resources import Resources
from app.kube.extender.wire import ExtenderArgs
from app.ledger.service import Ledger
from app.main import create_app
from app.settings import Settings
from bench._fixtures import fill, migrated, node_name, postgres_database, running_service
from bench._stats import repeated, summary

PODS_PER_NODE = 10
CANDIDATES = 1000
# An API server nobody listens on: the controllers retry in the background, the extender's
# filter and prioritize never call it.
KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "https://127.0.0.1:9"}}]
users: [{name: none, user: {token: none}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
"""


def fill_timed(database_url: str, n: int) -> float:
    started = time.monotonic()
    fill(database_url, n, PODS_PER_NODE)
    return time.monotonic() - started


def pod(cpu: str = "8", uid: str = "bench-filter") -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "bench", "uid": uid},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
    }


def candidates(n: int, rng: random.Random) -> list[str]:
    return [node_name(i) for i in rng.sample(range(n), min(n, CANDIDATES))]


def kube_settings(database_url: str, kubeconfig: Path, max_staleness: float) -> dict[str, str]:
    return {
        "NODELEDGER_KUBE_EXTENDER_MAX_STALENESS": str(max_staleness),
        "NODELEDGER_KUBE_ENABLED": "true",
        "NODELEDGER_KUBE_KUBECONFIG": str(kubeconfig),
        "NODELEDGER_KUBE_LEASE_DURATION": "60",  # few retries against the missing server
        "NODELEDGER_DATABASE_URL": database_url,
        "NODELEDGER_MIGRATE_ON_START": "false",
    }


def in_process(database_url: str, n: int, kubeconfig: Path, args: argparse.Namespace) -> Any:
    rng = random.Random(n)
    environment = kube_settings(database_url, kubeconfig, args.max_staleness)
    saved = {k: os.environ.get(k) for k in environment}
    os.environ.update(environment)
    try:
        settings = Settings()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    result: dict[str, Any] = {}
    app = create_app(settings)
    with TestClient(app):  # the lifespan: whatever the app starts, it starts here
        services = app.state.services
        ledger: Ledger = services.ledger
        t0 = time.perf_counter()
        ledger.list_nodes()
        result["list_nodes_s"] = round(time.perf_counter() - t0, 3)
        snapshot = getattr(services, "snapshot", None)
        if snapshot is not None:
            loads = repeated(snapshot.reload, 3, 60)
            result["snapshot_full_load_s"] = round(statistics.median(loads) / 1000, 3)
        extender = services.extender
        names = candidates(n, rng)
        extender_args = ExtenderArgs.model_validate({"Pod": pod(), "NodeNames": names})
        fits = len(extender.filter(extender_args).NodeNames)
        result["filter"] = {
            **summary(repeated(lambda: extender.filter(extender_args), args.samples, args.budget)),
            "candidates": len(names),
            "fit": fits,
        }
        if snapshot is not None:
            result["filter_after_an_admission"] = after_admissions(
                services, lambda: extender.filter(extender_args), n, args
            )
            result["filter_during_full_reloads"] = during_reloads(
                snapshot, lambda: extender.filter(extender_args), args
            )
    return result


def after_admissions(
    services: Any, call: Callable[[], Any], n: int, args: argparse.Namespace
) -> dict[str, Any]:
    """``call`` right after an admission somewhere (untimed), as a scheduler's next filter
    comes right after its last bind: the snapshot reads the changed node first."""
    rng, times = random.Random(n + 2), []
    deadline = time.monotonic() + args.budget
    for k in range(args.samples):
        holder = Holder(HolderKind.POD, f"bench-next-{k}")
        node = node_name(rng.randrange(n))
        with contextlib.suppress(AdmissionRejected):  # a drained node
            services.admissions.admit(AdmissionRequest(node, holder, Resources(10, 2**24)))
        times.extend(repeated(call, 1, args.budget))
        with contextlib.suppress(HoldingNotFound):
            services.admissions.release(ReleaseRequest(holder.id, HolderKind.POD))
        if time.monotonic() > deadline:
            break
    return summary(times)


def during_reloads(snapshot: Any, call: Callable[[], Any], args: argparse.Namespace) -> Any:
    """``call`` while full reloads run back to back in the background (one runs every
    5 minutes): what they cost the callers, who share the interpreter with them."""
    stop = threading.Event()
    reloads = [0]

    def reload() -> None:
        while not stop.is_set():
            snapshot.reload()
            reloads[0] += 1

    thread = threading.Thread(target=reload, daemon=True)
    thread.start()
    try:
        times = repeated(call, args.samples, args.budget)
    finally:
        stop.set()
        thread.join()
    return {**summary(times), "reloads": reloads[0]}


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def over_http(
    database_url: str, n: int, kubeconfig: Path, log_dir: Path, args: argparse.Namespace
) -> Any:
    rng = random.Random(n + 1)
    env = {
        **kube_settings(database_url, kubeconfig, args.max_staleness),
        "NODELEDGER_LOG_LEVEL": "error",
    }
    result: dict[str, Any] = {}
    with (
        running_service(database_url, log_dir, env=env, name=f"scale{n}", ready_timeout=300) as s,
        httpx.Client(base_url=s.url, timeout=120) as client,
    ):
        names = candidates(n, rng)
        body = {"Pod": pod(), "NodeNames": names}

        def call(method: str, path: str, expect: int, json_body: Any = None) -> Any:
            response = client.request(method, path, json=json_body)
            if response.status_code != expect:
                raise RuntimeError(f"{method} {path}: {response.status_code} {response.text}")
            return response.json() if response.content else None

        call("POST", "/v1/extender/filter", 200, body)  # warm-up
        for verb in ("filter", "prioritize"):
            samples = repeated(
                lambda v=verb: call("POST", f"/v1/extender/{v}", 200, body),  # type: ignore[misc]
                args.samples,
                args.budget,
            )
            result[verb] = {**summary(samples), "candidates": len(names)}
        uids = [f"bench-admit-{k}" for k in range(args.samples)]
        targets = iter([(uid, node_name(rng.randrange(n))) for uid in uids])

        def admit() -> None:
            uid, node = next(targets)
            admission = {
                "node": node,
                "holder": {"kind": "pod", "uid": uid},
                "requests": {"cpu": "10m", "memory": "16Mi"},
            }
            response = client.post("/v1/admissions", json=admission)
            if response.status_code not in (201, 409):  # 409: a drained node
                raise RuntimeError(f"admission: {response.status_code} {response.text}")
            if response.status_code == 201:
                admitted.append(uid)

        admitted: list[str] = []
        result["admit"] = summary(repeated(admit, len(uids), args.budget * 4))
        released = iter(admitted)
        result["release"] = summary(
            repeated(lambda: call("DELETE", f"/v1/admissions/{next(released)}", 200), len(admitted),
                  args.budget * 4)
        )  # fmt: skip
        result["get_node"] = summary(
            repeated(
                lambda: call("GET", f"/v1/nodes/{node_name(rng.randrange(n))}", 200),
                args.samples,
                args.budget,
            )
        )
        result["service_rss_mib"] = rss_mib(s.process.pid)
    return result


@contextmanager
def database(server_url: str | None, directory: Path, n: int) -> Iterator[str]:
    """A fresh migrated database: an SQLite file, or a new database on the server."""
    if server_url is None:
        yield migrated(f"sqlite:///{directory / f'scale{n}.db'}")
        return
    with postgres_database(server_url) as url:
        yield url


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="100,1000,15000")
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--budget", type=float, default=30.0, help="seconds per measurement")
    parser.add_argument("--database-url", help="a PostgreSQL server; default: SQLite files")
    parser.add_argument(
        "--max-staleness", type=float, default=0.0, help="NODELEDGER_KUBE_EXTENDER_MAX_STALENESS"
    )
    args = parser.parse_args(argv)

    backend = "sqlite" if args.database_url is None else "postgresql"
    results: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "database": backend,
        "extender_max_staleness": args.max_staleness,
        "pods_per_node": PODS_PER_NODE,
        "sizes": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        kubeconfig = directory / "kubeconfig"
        kubeconfig.write_text(KUBECONFIG)
        for n in (int(s) for s in args.sizes.split(",")):
            with database(args.database_url, directory, n) as url:
                case: dict[str, Any] = {"fill_s": round(fill_timed(url, n), 1)}
                case["in_process"] = in_process(url, n, kubeconfig, args)
                case["http"] = over_http(url, n, kubeconfig, directory, args)
                results["sizes"][str(n)] = case
                print(json.dumps({str(n): case}), file=sys.stderr)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
