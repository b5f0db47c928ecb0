"""`nodeledger serve` over HTTPS as a subprocess (the real CLI, uvicorn and TLS stack)."""

from __future__ import annotations

import contextlib
import ssl
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.auth.pki import CA, KeyPair
from tests.support.service import running_service


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
    tmp: Path, ca: CA, env: Mapping[str, str], ready_timeout: float = 120
) -> Iterator[TLSService]:
    """HTTPS with a server certificate from ``ca``, client certificates of ``ca`` accepted."""
    server = ca.server()
    tls_env = {
        "NODELEDGER_LOG_LEVEL": "debug",
        "NODELEDGER_AUTH_TLS_CERT_FILE": str(server.cert),
        "NODELEDGER_AUTH_TLS_KEY_FILE": str(server.key),
        "NODELEDGER_AUTH_TLS_CLIENT_CA_FILE": str(ca.cert),
        **env,
    }
    trust = ssl.create_default_context(cafile=str(ca.cert))
    with running_service(
        f"sqlite:///{tmp / f'ledger-{uuid.uuid4().hex[:8]}.db'}",
        tmp,
        env=tls_env,
        ready_timeout=ready_timeout,
        tls=trust,
    ) as service:
        yield TLSService(service.url, int(service.url.rsplit(":", 1)[1]), ca, service.log_path)
