"""`nodeledger serve` over HTTPS as a subprocess (the real CLI, uvicorn and TLS stack)."""

from __future__ import annotations

import contextlib
import os
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.auth.pki import CA, KeyPair
from tests.support.net import free_port
from tests.support.realenv import REPO


@dataclass(frozen=True)
class TLSService:
    url: str
    port: int
    ca: CA
    log: Path

    def client(self, pair: KeyPair | None = None) -> httpx.Client:
        context = ssl.create_default_context(cafile=str(self.ca.cert))
        if pair is not None:
            context.load_cert_chain(str(pair.cert), str(pair.key))
        return httpx.Client(base_url=self.url, verify=context, timeout=10)


@contextlib.contextmanager
def tls_service(
    tmp: Path, ca: CA, env: Mapping[str, str], ready_timeout: float = 30
) -> Iterator[TLSService]:
    """HTTPS with a server certificate from ``ca``, client certificates of ``ca`` accepted."""
    server = ca.server()
    port = free_port()
    full_env = {
        **os.environ,
        "NODELEDGER_DATABASE_URL": f"sqlite:///{tmp / f'ledger-{port}.db'}",
        "NODELEDGER_PORT": str(port),
        "NODELEDGER_HOST": "127.0.0.1",
        "NODELEDGER_LOG_LEVEL": "debug",
        "NODELEDGER_AUTH_TLS_CERT_FILE": str(server.cert),
        "NODELEDGER_AUTH_TLS_KEY_FILE": str(server.key),
        "NODELEDGER_AUTH_TLS_CLIENT_CA_FILE": str(ca.cert),
        **env,
    }
    log = tmp / f"serve-{port}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "app", "serve"], cwd=REPO, env=full_env, stdout=out, stderr=out
        )
    service = TLSService(f"https://127.0.0.1:{port}", port, ca, log)
    try:
        deadline = time.monotonic() + ready_timeout
        with service.client() as client:
            while True:
                if process.poll() is not None:
                    raise RuntimeError(f"nodeledger exited early:\n{log.read_text()}")
                with contextlib.suppress(httpx.TransportError):
                    if client.get("/readyz").status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"nodeledger not ready:\n{log.read_text()}")
                time.sleep(0.1)
        yield service
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
