"""Real `nodeledger serve` processes that the bench kills with SIGKILL and starts again on
the same port, so clients always know every replica's address."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent.parent
READY_TIMEOUT = 60.0


def readyz(client: httpx.Client, url: str, timeout: float = 3.0) -> dict[str, Any] | None:
    """The replica's /readyz body, or None when it does not answer in time (down,
    starting, or swamped: on two loaded cores an answer can take a second)."""
    try:
        response = client.get(f"{url}/readyz", timeout=timeout)
    except httpx.TransportError:
        return None
    if response.status_code != 200:
        return None
    body: dict[str, Any] = response.json()
    return body


def slurm_role(health: dict[str, Any] | None) -> str:
    """'leader' (runs the Slurm sync), 'standby', 'down', or why it is degraded (the
    first words of its /readyz check, e.g. 'degraded: not synced with Slurm yet')."""
    if health is None:
        return "down"
    check = str(health.get("checks", {}).get("slurm", ""))
    if check.startswith("synced"):
        return "leader"
    if check.startswith("standby"):
        return "standby"
    return ": ".join(part.strip() for part in check.split(":")[:2])  # 'degraded: <why>'


@dataclass
class Replica:
    index: int
    port: int
    log_path: Path
    env: Mapping[str, str]
    process: subprocess.Popen[bytes] | None = None
    generation: int = 0  # how many times it was started; (index, generation) names one process
    ready_seconds: list[float] = field(default_factory=list)  # start -> /readyz 200, per start

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def start(self) -> None:
        self.generation += 1
        with self.log_path.open("ab") as log:
            log.write(
                f"\n=== chaos bench: start #{self.generation} at {time.time():.3f}\n".encode()
            )
            log.flush()
            self.process = subprocess.Popen(
                [sys.executable, "-m", "app", "serve"],
                cwd=REPO,
                env=dict(self.env),
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def kill(self) -> None:
        """SIGKILL: no shutdown hook runs, sockets and database sessions just vanish."""
        if self.process is None:
            return
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.kill()

    def wait_ready(self, client: httpx.Client, started: float) -> None:
        deadline = started + READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"replica {self.index} exited; see {self.log_path}")
            if readyz(client, self.url, timeout=1.0) is not None:
                self.ready_seconds.append(time.monotonic() - started)
                return
            time.sleep(0.05)
        raise RuntimeError(f"replica {self.index} not ready after {READY_TIMEOUT}s")

    def restart(self, client: httpx.Client) -> None:
        started = time.monotonic()
        self.start()
        self.wait_ready(client, started)


def service_env(database_url: str, port: int, extra: Mapping[str, str]) -> dict[str, str]:
    """Our environment without any NODELEDGER_* of the bench's own (cluster options),
    plus the service's settings."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("NODELEDGER_")}
    return {
        **base,
        "NODELEDGER_LOG_LEVEL": "warning",
        "NODELEDGER_MIGRATE_ON_START": "false",  # the bench migrated the database once
        **extra,
        "NODELEDGER_DATABASE_URL": database_url,
        "NODELEDGER_HOST": "127.0.0.1",
        "NODELEDGER_PORT": str(port),
    }


class ReplicaPool:
    def __init__(self, replicas: list[Replica]) -> None:
        self.replicas = replicas
        self._client = httpx.Client()

    @property
    def urls(self) -> list[str]:
        return [r.url for r in self.replicas]

    def start_all(self) -> None:
        started = time.monotonic()
        for replica in self.replicas:
            replica.start()
        for replica in self.replicas:
            replica.wait_ready(self._client, started)

    def roles(self) -> list[str]:
        return [slurm_role(readyz(self._client, r.url)) for r in self.replicas]

    def leader(self) -> Replica | None:
        for replica, role in zip(self.replicas, self.roles(), strict=True):
            if role == "leader":
                return replica
        return None

    def restart(self, replica: Replica) -> None:
        replica.restart(self._client)

    def stop_all(self) -> None:
        for replica in self.replicas:
            replica.stop()
        self._client.close()

    def ready_seconds(self) -> list[float]:
        return [s for r in self.replicas for s in r.ready_seconds[1:]]  # restarts only
