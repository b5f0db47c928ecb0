"""`nodeledger serve` with the Kubernetes integration on, as the thing measured: started
as a subprocess, timed to ready and to synced, read through its JSON log and /metrics."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from bench.kubescale.cluster import REPO
from bench.kubescale.load import MANAGED

# ListWatch's line after every list: "pods: listed 150000 in 3.21 s, resync 1.02 s".
LISTED = re.compile(r"^(\w+): listed (\d+) in ([\d.]+) s, resync ([\d.]+) s$")
RESYNCED = re.compile(r"^(\w+): resync of (\d+) from the watch, ([\d.]+) s$")
MIRROR = re.compile(r"^GenericNode status resync: (\d+) of (\d+) differ .*\(([\d.]+) s\)$")
WRITES = "nodeledger_kube_status_writes_total"


class Service:
    def __init__(
        self,
        database_url: str,
        kubeconfig: Path,
        port: int,
        log: Path,
        env: dict[str, str],
        code: Path = REPO,
    ) -> None:
        """``code``: the checkout whose ``app`` runs (another one: a before/after bench)."""
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        self.env = {
            **os.environ,
            "NODELEDGER_DATABASE_URL": database_url,
            "NODELEDGER_HOST": "127.0.0.1",
            "NODELEDGER_PORT": str(port),
            "NODELEDGER_LOG_FORMAT": "json",
            "NODELEDGER_LOG_LEVEL": "info",
            "NODELEDGER_KUBE_ENABLED": "true",
            "NODELEDGER_KUBE_KUBECONFIG": str(kubeconfig),
            "NODELEDGER_KUBE_NODE_SELECTOR": f"{MANAGED}=true",
            "NODELEDGER_KUBE_IDENTITY": "kube-scale",
            # Cluster totals only, read at most every 5 min: scrapes for the write counter
            # must not cost a 15,000-node ledger read each.
            "NODELEDGER_METRICS_PER_NODE": "false",
            "NODELEDGER_METRICS_CACHE_SECONDS": "300",
            **env,
        }
        self.code = code
        self.process: subprocess.Popen[bytes] | None = None
        self.started = 0.0

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> None:
        with self.log.open("wb") as out:  # this run only: resyncs() reads it back
            self.process = subprocess.Popen(
                [sys.executable, "-m", "app", "serve"],
                cwd=self.code,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.started = time.monotonic()

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def readyz(self) -> dict[str, Any] | None:
        try:
            response = httpx.get(f"{self.url}/readyz", timeout=5)
        except httpx.HTTPError:
            return None
        return response.json() if response.status_code == 200 else None

    def wait(self, what: str, check: Callable[[], bool], timeout: float) -> float | None:
        """Seconds from start until ``check`` held, None after ``timeout``."""
        deadline = self.started + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"nodeledger exited: {self.log}")
            if check():
                return round(time.monotonic() - self.started, 2)
            time.sleep(0.2)
        print(f"kube-scale: {what} not reached in {timeout} s", file=sys.stderr)
        return None

    def synced(self) -> bool:
        body = self.readyz()
        return body is not None and body.get("checks", {}).get("kubernetes") == "leading"

    def counter(self, name: str) -> float:
        text = httpx.get(f"{self.url}/metrics", timeout=30).text
        match = re.search(rf"^{name} ([0-9.e+]+)$", text, re.MULTILINE)
        return float(match.group(1)) if match else 0.0

    def node(self, name: str) -> dict[str, Any]:
        body: dict[str, Any] = httpx.get(f"{self.url}/v1/nodes/{name}", timeout=30).json()
        return body

    def log_messages(self) -> list[str]:
        messages = []
        for line in self.log.read_text(errors="replace").splitlines():
            try:
                messages.append(str(json.loads(line)["message"]))
            except (ValueError, KeyError, TypeError):
                continue
        return messages

    def resyncs(self) -> list[dict[str, Any]]:
        """Every list-and-resync and status resync the log reports, in order."""
        found: list[dict[str, Any]] = []
        for message in self.log_messages():
            if m := LISTED.match(message):
                found.append(
                    {"watch": m[1], "objects": int(m[2]),
                     "list_s": float(m[3]), "resync_s": float(m[4])}
                )  # fmt: skip
            elif m := RESYNCED.match(message):  # periodic: no LIST
                found.append({"watch": m[1], "objects": int(m[2]), "resync_s": float(m[3])})
            elif m := MIRROR.match(message):
                found.append(
                    {"watch": "genericnode-status", "objects": int(m[2]),
                     "differ": int(m[1]), "resync_s": float(m[3])}
                )  # fmt: skip
        return found


def settle(service: Service, timeout: float, quiet: float = 20) -> dict[str, Any]:
    """Wait until the status writes stop (no new write for ``quiet`` seconds)."""
    started = time.monotonic()
    last, last_change = service.counter(WRITES), time.monotonic()
    while time.monotonic() - last_change < quiet and time.monotonic() - started < timeout:
        time.sleep(1)
        now = service.counter(WRITES)
        if now != last:
            last, last_change = now, time.monotonic()
    return {"status_writes": int(last), "last_write_after_s": round(last_change - started, 1)}
