"""Routes with authentication on: who gets 401, 403, 503, which routes are guarded, and
that reads stay open unless asked otherwise. The API server is a fake here
(tests/auth/test_kube_apiserver.py uses the real one)."""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest
from cachetools import TTLCache
from fastapi.testclient import TestClient
from starlette.requests import Request

from app.auth.errors import Forbidden, Unauthenticated
from app.auth.guard import Guard
from app.auth.model import Identity, Permission
from app.auth.reviews import AccessReviewer, TokenReviewer
from app.auth.settings import AuthSettings
from app.auth.tls import CLIENT_IDENTITY
from tests.auth.conftest import MakeApp
from tests.auth.fakes import (
    ALL_TOKENS,
    NODE,
    READER_TOKEN,
    STRANGER_TOKEN,
    WRITER_TOKEN,
    FakeReviews,
    admission,
    bearer,
)

WRITES = {"PUT", "POST", "DELETE", "PATCH"}
EXTENDER_READS = {"/v1/extender/filter", "/v1/extender/prioritize"}
READS = [
    ("GET", "/v1/nodes"),
    ("GET", "/v1/nodes/n1"),
    ("GET", "/v1/holdings"),
    ("GET", "/v1/events"),
    ("POST", "/v1/extender/filter"),
    ("POST", "/v1/extender/prioritize"),
]


def write_routes(client: TestClient) -> list[tuple[str, str]]:
    """Every (method, path) of the app's OpenAPI document that changes something, path
    parameters filled in: a write route added later is covered without a list to update."""
    routes = []
    for path, operations in client.get("/openapi.json").json()["paths"].items():
        if path in EXTENDER_READS:
            continue
        for method in sorted({m.upper() for m in operations} & WRITES):
            routes.append((method, re.sub(r"\{[^}]+\}", "n1", path)))
    return routes


def call(client: TestClient, method: str, path: str, **kwargs: Any) -> Any:
    return client.request(method, path, json=kwargs.pop("json", {}), **kwargs)


@pytest.mark.parametrize("mode", ["static", "kubernetes"])
def test_every_write_route_answers_401_without_a_caller(make_app: MakeApp, mode: str) -> None:
    client = make_app(mode)
    routes = write_routes(client)
    assert set(routes) >= {
        ("PUT", "/v1/nodes/n1"),
        ("DELETE", "/v1/nodes/n1"),
        ("POST", "/v1/admissions"),
        ("DELETE", "/v1/admissions/n1"),
        ("POST", "/v1/extender/bind"),
    }
    for method, path in routes:
        answer = call(client, method, path)
        assert answer.status_code == 401, (method, path, answer.text)
        assert answer.headers["www-authenticate"] == 'Bearer realm="nodeledger"'
        body = answer.json()
        assert body["code"] == "unauthenticated"
        assert body["retryable"] is False
        assert "Authorization: Bearer <token>" in body["detail"]


@pytest.mark.parametrize("mode", ["static", "kubernetes"])
def test_reads_are_open_by_default(make_app: MakeApp, mode: str, reviews: FakeReviews) -> None:
    client = make_app(mode)
    for method, path in READS:
        assert call(client, method, path).status_code != 401, (method, path)
    assert reviews.calls == {}


@pytest.mark.parametrize("mode", ["static", "kubernetes"])
def test_reads_need_a_caller_when_protected(make_app: MakeApp, mode: str) -> None:
    client = make_app(mode, protect_reads=True)
    for method, path in READS:
        answer = call(client, method, path)
        assert answer.status_code == 401, (method, path, answer.text)
    assert client.get("/healthz").status_code == 200  # probes stay open
    assert client.get("/readyz").status_code == 200
    assert client.get("/v1/nodes", headers=bearer(READER_TOKEN)).status_code == 200
    refused = client.get("/v1/holdings", headers=bearer(READER_TOKEN))
    assert refused.status_code == 403
    assert "may not list holdings.nodeledger.io" in refused.json()["detail"]


def test_static_tokens_allow_what_their_entry_lists(make_app: MakeApp) -> None:
    client = make_app("static")
    writer, reader = bearer(WRITER_TOKEN), bearer(READER_TOKEN)
    assert client.put("/v1/nodes/n1", json=NODE, headers=writer).status_code == 201
    assert client.post("/v1/admissions", json=admission(), headers=writer).status_code == 201
    refused = client.post("/v1/admissions", json=admission(uid="u2"), headers=reader)
    assert refused.status_code == 403
    body = refused.json()
    assert body["code"] == "forbidden"
    assert body["retryable"] is False
    assert body["detail"].startswith('user "viewer" may not create admissions.nodeledger.io "n1"')
    # "create admissions" does not include delete
    released = client.delete("/v1/admissions/u1", headers=writer)
    assert released.status_code == 403
    assert 'may not delete admissions.nodeledger.io "u1"' in released.json()["detail"]
    assert len(client.get("/v1/holdings").json()) == 1


@pytest.mark.parametrize(
    "header", ["Basic dXNlcjpwYXNz", "Bearer", "Bearer   ", "Token abc", WRITER_TOKEN]
)
def test_a_malformed_authorization_header_is_401(make_app: MakeApp, header: str) -> None:
    client = make_app("static")
    answer = client.put("/v1/nodes/n1", json=NODE, headers={"Authorization": header})
    assert answer.status_code == 401
    assert answer.json()["detail"] == "the Authorization header must be 'Bearer <token>'"


@pytest.mark.parametrize("mode", ["static", "kubernetes"])
def test_an_unknown_token_is_401(make_app: MakeApp, mode: str) -> None:
    client = make_app(mode)
    answer = client.put("/v1/nodes/n1", json=NODE, headers=bearer(STRANGER_TOKEN))
    assert answer.status_code == 401
    assert answer.headers["www-authenticate"].startswith("Bearer")
    assert "bearer token is not valid" in answer.json()["detail"]


def test_kubernetes_mode_reviews_the_token_and_the_permission(
    make_app: MakeApp, reviews: FakeReviews
) -> None:
    client = make_app("kubernetes")
    writer = bearer(WRITER_TOKEN)
    assert client.put("/v1/nodes/n1", json=NODE, headers=writer).status_code == 201
    assert client.put("/v1/nodes/n2", json=NODE, headers=writer).status_code == 201
    assert client.post("/v1/admissions", json=admission(), headers=writer).status_code == 201
    assert reviews.specs[-1] == {
        "user": "system:serviceaccount:ci:writer",
        "groups": ["system:serviceaccounts", "system:authenticated"],
        "uid": "uid-system:serviceaccount:ci:writer",
        "extra": {"authentication.kubernetes.io/pod-name": ["p"]},
        "resourceAttributes": {
            "group": "nodeledger.io",
            "resource": "admissions",
            "verb": "create",
            "name": "n1",
        },
    }
    # The writer may delete node n1 only (a grant with resourceNames).
    refused = client.delete("/v1/nodes/n2", headers=writer)
    assert refused.status_code == 403
    assert refused.json()["detail"] == (
        'user "system:serviceaccount:ci:writer" may not delete nodes.nodeledger.io "n2"'
    )
    reader = client.post("/v1/admissions", json=admission(uid="u2"), headers=bearer(READER_TOKEN))
    assert reader.status_code == 403
    assert client.delete("/v1/admissions/u1", headers=writer).status_code == 200


def test_an_unreachable_api_server_is_503_and_nothing_is_admitted(
    make_app: MakeApp, reviews: FakeReviews
) -> None:
    client = make_app("kubernetes")
    reviews.down = True
    answer = client.post("/v1/admissions", json=admission(), headers=bearer(WRITER_TOKEN))
    assert answer.status_code == 503
    body = answer.json()
    assert body["code"] == "auth_unavailable"
    assert body["retryable"] is True
    assert "the review by the Kubernetes API server failed" in body["detail"]
    assert "tokenreviews: refused" in body["detail"]
    assert client.get("/v1/holdings").json() == []
    # Failures are not cached: the next call reviews again and succeeds.
    reviews.down = False
    assert client.put("/v1/nodes/n1", json=NODE, headers=bearer(WRITER_TOKEN)).status_code == 201


def test_a_cached_review_is_not_asked_again(make_app: MakeApp, reviews: FakeReviews) -> None:
    client = make_app("kubernetes")
    for _ in range(3):
        client.put("/v1/nodes/n1", json=NODE, headers=bearer(WRITER_TOKEN))
        client.put("/v1/nodes/n1", json=NODE, headers=bearer(STRANGER_TOKEN))
        client.post("/v1/admissions", json=admission(), headers=bearer(READER_TOKEN))
    # One TokenReview per token, one SubjectAccessReview per (caller, permission): the
    # stranger's refusal and the reader's 403 are cached as well.
    assert reviews.calls == {"token": 3, "access": 2}


@pytest.mark.anyio
async def test_cached_reviews_expire_after_the_ttl(reviews: FakeReviews) -> None:
    now = [0.0]
    tokens = TokenReviewer(reviews, TTLCache(maxsize=100, ttl=5.0, timer=lambda: now[0]))
    access = AccessReviewer(reviews, TTLCache(maxsize=100, ttl=5.0, timer=lambda: now[0]))
    permission = Permission("create", "admissions", "n1")
    for at in (0.0, 4.9, 5.0, 9.9):
        now[0] = at
        identity = await tokens.authenticate(WRITER_TOKEN)
        assert (await access.authorize(identity, permission)).allowed
    assert reviews.calls == {"token": 2, "access": 2}


def test_no_token_reaches_a_log_line_or_an_answer(
    make_app: MakeApp, reviews: FakeReviews, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    answers = []
    for mode in ("static", "kubernetes"):
        client = make_app(mode)
        for token in ALL_TOKENS:
            answers.append(client.put("/v1/nodes/n1", json=NODE, headers=bearer(token)))
            answers.append(client.post("/v1/admissions", json=admission(), headers=bearer(token)))
    reviews.down = True
    client = make_app("kubernetes")
    answers.append(client.post("/v1/admissions", json=admission(), headers=bearer(WRITER_TOKEN)))
    assert {a.status_code for a in answers} >= {200, 201, 401, 403, 503}
    assert "a bearer token was not accepted: invalid bearer token [redacted]" in caplog.text
    assert "denied: user" in caplog.text
    assert "TokenReview failed" in caplog.text
    for token in ALL_TOKENS:
        assert token not in caplog.text
        for answer in answers:
            assert token not in answer.text
            assert token not in str(answer.headers)


def request_with(scope_state: dict[str, Any], headers: dict[str, str] | None = None) -> Request:
    raw = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    return Request({"type": "http", "headers": raw, "state": scope_state, "path_params": {}})


@pytest.mark.anyio
async def test_a_client_certificate_is_an_identity_and_a_token_takes_precedence(
    reviews: FakeReviews,
) -> None:
    reviews.grants.add(("scheduler", "create", "bindings", None))
    guard = Guard(
        TokenReviewer(reviews, TTLCache(maxsize=10, ttl=5.0)),
        AccessReviewer(reviews, TTLCache(maxsize=10, ttl=5.0)),
    )
    bind = Permission("create", "bindings", "kn1")
    scheduler = Identity.of("scheduler", ["sched"], via="certificate")
    request = request_with({CLIENT_IDENTITY: scheduler})
    assert await guard.check(request, bind) == scheduler
    assert request.state.identity == scheduler
    assert reviews.specs[-1]["user"] == "scheduler"
    assert reviews.specs[-1]["groups"] == ["sched"]
    # A bearer token on the same connection is the caller instead (and may not bind).
    with pytest.raises(Forbidden):
        await guard.check(request_with({CLIENT_IDENTITY: scheduler}, bearer(READER_TOKEN)), bind)
    with pytest.raises(Unauthenticated):
        await guard.check(request_with({}), bind)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"mode": "static"}, "needs NODELEDGER_AUTH_TOKEN_FILE"),
        ({"protect_reads": True}, "NODELEDGER_AUTH_PROTECT_READS needs a NODELEDGER_AUTH_MODE"),
        ({"tls_cert_file": "c.pem"}, "set both"),
        ({"tls_client_ca_file": "ca.pem"}, "needs HTTPS"),
        ({"mode": "ldap"}, "Input should be 'none', 'static' or 'kubernetes'"),
    ],
)
def test_inconsistent_settings_are_refused(values: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        AuthSettings(**values)


def test_the_default_is_open_and_says_so(api: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    assert AuthSettings().mode == "none"
    assert api.put("/v1/nodes/n1", json=NODE).status_code == 201
    warnings = [r.getMessage() for r in caplog.get_records("setup") if r.levelname == "WARNING"]
    assert "NODELEDGER_AUTH_MODE=none: anyone who reaches the API may change the ledger" in warnings
