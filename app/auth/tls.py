"""HTTPS for `nodeledger serve`, and client certificates as identities.

kube-scheduler cannot send a bearer token to an extender: its Extender configuration has
only ``tlsConfig`` (caFile/caData for the server, certFile/keyFile for a client
certificate). So the service accepts, next to bearer tokens, a client certificate signed by
NODELEDGER_AUTH_TLS_CLIENT_CA_FILE, verified in the TLS handshake; its subject is the
identity (CN = user, O = groups, as the API server reads client certificates), authorized
like any other caller.

uvicorn does not put the peer certificate into the ASGI scope, so the HTTP protocol below
copies the verified subject into the connection's ``scope["state"]`` (every request of
the connection gets a copy of it); a client without a certificate has none there.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

from starlette.types import Scope

from app.auth.model import Identity
from app.auth.settings import AuthSettings
from app.protocol import HeadDeadlineProtocol

CLIENT_IDENTITY = "nodeledger.auth.client_certificate"


def certificate_identity(peercert: Any) -> Identity | None:
    """The identity of ``SSLSocket.getpeercert()`` (a verified certificate), or None."""
    if not isinstance(peercert, dict):
        return None
    user, groups = "", []
    for rdn in peercert.get("subject") or ():
        for key, value in rdn:
            if key == "commonName":
                user = str(value)
            elif key == "organizationName":
                groups.append(str(value))
    return Identity.of(user, groups, via="certificate") if user else None


def client_identity(scope: Scope) -> Identity | None:
    identity = (scope.get("state") or {}).get(CLIENT_IDENTITY)
    return identity if isinstance(identity, Identity) else None


class ClientCertificateProtocol(HeadDeadlineProtocol):
    """uvicorn's HTTP/1.1 protocol (with the head deadline), plus the client certificate's
    identity in the state."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        identity = certificate_identity(transport.get_extra_info("peercert"))
        if identity is not None:
            self.app_state = {**self.app_state, CLIENT_IDENTITY: identity}
        super().connection_made(transport)


def uvicorn_options(auth: AuthSettings, *, head_timeout: float) -> dict[str, Any]:
    """Keyword arguments of uvicorn.run: the HTTP protocol (each request's head within
    ``head_timeout`` seconds), and HTTPS and client certificates when configured."""
    protocol: type[HeadDeadlineProtocol] = HeadDeadlineProtocol
    if auth.tls_client_ca_file is not None and auth.tls_cert_file is not None:
        protocol = ClientCertificateProtocol
    http = {"http": protocol.with_timeout(head_timeout)}
    if auth.tls_cert_file is None or auth.tls_key_file is None:
        return http
    options: dict[str, Any] = {
        "ssl_certfile": str(auth.tls_cert_file),
        "ssl_keyfile": str(auth.tls_key_file),
    }
    if auth.tls_client_ca_file is not None:
        options |= {
            "ssl_ca_certs": str(auth.tls_client_ca_file),
            # Optional: bearer-token callers (and probes) connect without a certificate.
            "ssl_cert_reqs": ssl.CERT_OPTIONAL,
        }
    return options | http
