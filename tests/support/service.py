"""Run the real `nodeledger serve` as a subprocess, as an operator would."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support.net import free_port
from tests.support.realenv import REPO


@dataclass(frozen=True)
class ServiceProcess:
    url: str
    log_path: Path
    process: subprocess.Popen[bytes]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextmanager
def running_service(
    database_url: str,
    log_dir: Path,
    *,
    env: Mapping[str, str] | None = None,
    name: str = "nodeledger",
    ready_timeout: float = 120.0,  # a loaded machine imports and migrates slowly
    port: int | None = None,
    tls: ssl.SSLContext | None = None,
) -> Iterator[ServiceProcess]:
    """Start the service (on a free port unless given), wait for /readyz, stop it afterwards.
    With ``tls`` (a client context trusting the server's certificate) it serves HTTPS; the
    certificates come through ``env`` (NODELEDGER_AUTH_TLS_*)."""
    port = port or free_port()
    log_path = log_dir / f"{name}-{port}.log"
    full_env = {
        **os.environ,
        "NODELEDGER_LOG_LEVEL": "warning",
        **(env or {}),
        "NODELEDGER_DATABASE_URL": database_url,
        "NODELEDGER_PORT": str(port),
        "NODELEDGER_HOST": "127.0.0.1",
    }
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "app", "serve"],
            cwd=REPO,
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    scheme = "https" if tls is not None else "http"
    service = ServiceProcess(f"{scheme}://127.0.0.1:{port}", log_path, process)
    try:
        _wait_ready(service, ready_timeout, tls)
        yield service
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        # pytest shows a failed test's captured output: the service's last words with it.
        # On stderr: a bench's stdout is its JSON alone.
        tail = service.log().splitlines()[-60:]
        print(f"--- {log_path.name} (last 60 lines)", *tail, sep="\n", file=sys.stderr)


def _wait_ready(service: ServiceProcess, timeout: float, tls: ssl.SSLContext | None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if service.process.poll() is not None:
            raise RuntimeError(f"nodeledger exited early:\n{service.log()}")
        try:
            ready = httpx.get(f"{service.url}/readyz", timeout=1.0, verify=tls or True)
            if ready.status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"nodeledger not ready after {timeout}s:\n{service.log()}")
