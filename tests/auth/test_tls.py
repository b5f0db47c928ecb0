"""`nodeledger serve` over HTTPS, with client certificates as identities, as a real process
(uvicorn's own TLS handshake, the protocol that carries the certificate's subject into the
request). Static mode decides here; the kube-scheduler's use of it is in
tests/auth/test_kube_apiserver.py."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.auth.settings import AuthSettings
from app.auth.tls import ClientCertificateProtocol, certificate_identity, uvicorn_options
from app.protocol import HeadDeadlineProtocol
from tests.auth.fakes import NODE, WRITER_TOKEN, admission, bearer, write_tokens
from tests.auth.pki import CA
from tests.auth.serve import TLSService, tls_service


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TLSService]:
    tmp = tmp_path_factory.mktemp("tls")
    tokens = write_tokens(
        tmp / "tokens.json",
        [
            {"user": "ci", "token": WRITER_TOKEN, "allow": ["*"]},
            {"user": "scheduler", "allow": ["update nodes", "create admissions", "create *"]},
        ],
    )
    env = {"NODELEDGER_AUTH_MODE": "static", "NODELEDGER_AUTH_TOKEN_FILE": str(tokens)}
    with tls_service(tmp, CA.create(tmp / "pki"), env) as service:
        yield service


def test_serves_https_and_probes_need_no_certificate(service: TLSService) -> None:
    with service.client() as client:
        assert client.get("/healthz").status_code == 200
        assert client.get("/v1/nodes").status_code == 200  # reads open by default
    with pytest.raises(httpx.TransportError):
        httpx.get(service.url.replace("https", "http") + "/healthz", timeout=5)


def test_a_client_certificate_is_the_caller(service: TLSService) -> None:
    scheduler = service.ca.client("scheduler", "scheduler", ("nodeledger:schedulers",))
    with service.client() as anonymous:
        answer = anonymous.put("/v1/nodes/n1", json=NODE)
        assert answer.status_code == 401
        assert answer.headers["www-authenticate"] == 'Bearer realm="nodeledger"'
    with service.client(scheduler) as client:
        assert client.put("/v1/nodes/n1", json=NODE).status_code in (200, 201)
        assert client.post("/v1/admissions", json=admission(uid="tls-1")).status_code == 201
        # Authorized; the extender itself is off in this service.
        bind = {"PodName": "p", "PodNamespace": "ns", "PodUID": "u", "Node": "n1"}
        answer = client.post("/v1/extender/bind", json=bind)
        assert answer.status_code == 404
        assert "NODELEDGER_KUBE_ENABLED" in answer.text
        # Several requests on one connection keep the identity; reads stay open.
        assert client.get("/v1/holdings").status_code == 200
        refused = client.delete("/v1/admissions/tls-1")
        assert refused.status_code == 403
        assert refused.json()["detail"].startswith(
            'user "scheduler" may not delete admissions.nodeledger.io "tls-1"'
        )


def test_a_token_works_over_https_and_a_certificate_without_an_entry_is_403(
    service: TLSService,
) -> None:
    with service.client() as client:
        answer = client.put("/v1/nodes/n2", json=NODE, headers=bearer(WRITER_TOKEN))
        assert answer.status_code == 201
    intruder = service.ca.client("intruder", "intruder")
    with service.client(intruder) as client:
        answer = client.put("/v1/nodes/n2", json=NODE)
        assert answer.status_code == 403
        assert answer.json()["detail"] == (
            'user "intruder" may not update nodes.nodeledger.io "n2": '
            'no entry for user "intruder" in the token file allows it'
        )
    assert WRITER_TOKEN not in service.log.read_text()


def test_a_certificate_from_another_ca_is_refused_in_the_handshake(
    service: TLSService, tmp_path: Path
) -> None:
    rogue = CA.create(tmp_path / "rogue", "rogue").client("rogue-scheduler", "scheduler")
    with service.client(rogue) as client, pytest.raises(httpx.TransportError):
        client.put("/v1/nodes/n3", json=NODE)


def test_uvicorn_options_follow_the_settings(tmp_path: Path) -> None:
    plain = uvicorn_options(AuthSettings(), head_timeout=7)
    assert list(plain) == ["http"]
    assert issubclass(plain["http"], HeadDeadlineProtocol)
    assert plain["http"].head_timeout == 7
    cert, key, ca = tmp_path / "c", tmp_path / "k", tmp_path / "ca"
    https = uvicorn_options(AuthSettings(tls_cert_file=cert, tls_key_file=key), head_timeout=7)
    assert https == {"ssl_certfile": str(cert), "ssl_keyfile": str(key), "http": https["http"]}
    mutual = uvicorn_options(
        AuthSettings(tls_cert_file=cert, tls_key_file=key, tls_client_ca_file=ca), head_timeout=7
    )
    assert mutual["ssl_cert_reqs"] == ssl.CERT_OPTIONAL
    assert mutual["ssl_ca_certs"] == str(ca)
    assert issubclass(mutual["http"], ClientCertificateProtocol)
    assert mutual["http"].head_timeout == 7


def test_the_subject_of_a_verified_certificate_is_the_identity() -> None:
    peercert = {
        "subject": (
            (("organizationName", "g1"),),
            (("organizationName", "g2"),),
            (("commonName", "system:serviceaccount:ops:nl-nodeledger-scheduler"),),
        )
    }
    identity = certificate_identity(peercert)
    assert identity is not None
    assert identity.user == "system:serviceaccount:ops:nl-nodeledger-scheduler"
    assert identity.groups == ("g1", "g2")
    assert identity.via == "certificate"
    assert certificate_identity(None) is None
    assert certificate_identity({}) is None  # no certificate, or not verified
    assert certificate_identity({"subject": ((("organizationName", "g"),),)}) is None
