"""Static tokens: the file's format, re-reading it when it changes, failing closed when it
is broken; and the Kubernetes reviews' I/O shell (its API calls are faked here)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from app.auth.errors import AuthUnavailable, Unauthenticated
from app.auth.model import Identity, Permission
from app.auth.reviews import ReviewError
from app.auth.static import StaticTokens
from app.kube.client import KubeClient, KubeError
from app.kube.reviews import KubeReviews
from app.outages import Dependency
from tests.auth.fakes import READER_TOKEN, STATIC_ENTRIES, WRITER_TOKEN, bearer, write_tokens

pytestmark = pytest.mark.anyio
NEW_TOKEN = "rotated-token-0a1b2c3d4e5f6789"


def replace(path: Path, entries: Any) -> None:
    """Rotate the file the way a Secret volume does: a new file moved into place."""
    fresh = path.with_suffix(".new")
    fresh.write_text(entries if isinstance(entries, str) else json.dumps(entries))
    os.replace(fresh, path)


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    return write_tokens(tmp_path / "tokens.json", STATIC_ENTRIES)


async def test_a_token_is_its_entrys_user_with_its_permissions(token_file: Path) -> None:
    tokens = StaticTokens(token_file)
    viewer = await tokens.authenticate(READER_TOKEN)
    assert viewer == Identity.of("viewer", ["ops"])
    assert (await tokens.authorize(viewer, Permission("list", "nodes"))).allowed
    refused = await tokens.authorize(viewer, Permission("update", "nodes", "n1"))
    assert not refused.allowed
    assert refused.reason == 'no entry for user "viewer" in the token file allows it'
    ci = await tokens.authenticate(WRITER_TOKEN)
    for verb in ("update", "delete", "get"):  # "* nodes"
        assert (await tokens.authorize(ci, Permission(verb, "nodes", "n9"))).allowed
    # An entry without a token names a client certificate's user.
    scheduler = Identity.of("scheduler", via="certificate")
    assert (await tokens.authorize(scheduler, Permission("create", "bindings", "kn1"))).allowed
    with pytest.raises(Unauthenticated):
        await tokens.authenticate("scheduler-has-no-token-0000")


async def test_a_changed_file_is_read_again(token_file: Path) -> None:
    tokens = StaticTokens(token_file)
    assert (await tokens.authenticate(WRITER_TOKEN)).user == "ci"
    replace(token_file, [{"user": "ci", "token": NEW_TOKEN, "allow": ["*"]}])
    assert (await tokens.authenticate(NEW_TOKEN)).user == "ci"
    with pytest.raises(Unauthenticated):
        await tokens.authenticate(WRITER_TOKEN)  # revoked
    admin = await tokens.authenticate(NEW_TOKEN)
    assert (await tokens.authorize(admin, Permission("delete", "admissions", "u"))).allowed


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (f'[{{"user": "ci", "token": "{WRITER_TOKEN}"', "not JSON (line 1, column"),
        ([{"user": "ci", "token": "short-secret"}], "0.token: String should have at least 16"),
        ([{"user": "ci", "token": WRITER_TOKEN, "allow": ["craete admissions"]}], "0.allow"),
        ([{"user": "ci", "token": WRITER_TOKEN, "allow": ["everything"]}], "verb one of"),
        ([{"user": "ci", "token": WRITER_TOKEN, "role": "admin"}], "0: an unknown key"),
        ([{"user": "a", "token": WRITER_TOKEN}, {"user": "b", "token": WRITER_TOKEN}], "twice"),
        ({"ci": WRITER_TOKEN}, "Input should be a valid list"),
    ],
)
async def test_a_broken_file_refuses_everyone_and_says_where(
    token_file: Path, content: Any, message: str
) -> None:
    tokens = StaticTokens(token_file)
    replace(token_file, content)
    with pytest.raises(AuthUnavailable) as refused:
        await tokens.authenticate(READER_TOKEN)
    assert message in refused.value.message
    assert str(token_file) in refused.value.message
    for secret in (WRITER_TOKEN, "short-secret"):
        assert secret not in refused.value.message
    with pytest.raises(AuthUnavailable):
        await tokens.authorize(Identity.of("viewer"), Permission("list", "nodes"))
    # Fixed: works again without a restart.
    replace(token_file, STATIC_ENTRIES)
    assert (await tokens.authenticate(READER_TOKEN)).user == "viewer"


async def test_a_missing_file_refuses_everyone(token_file: Path) -> None:
    tokens = StaticTokens(token_file)
    token_file.unlink()
    with pytest.raises(AuthUnavailable, match="No such file"):
        await tokens.authenticate(READER_TOKEN)
    write_tokens(token_file, STATIC_ENTRIES)
    assert (await tokens.authenticate(READER_TOKEN)).user == "viewer"


def test_a_broken_file_stops_the_start(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(ValueError, match="not JSON"):
        StaticTokens(bad)


class FakeKubeClient:
    """KubeClient.request as the API server answers: the TokenReview echoes the token."""

    def __init__(self, error: str | None = None) -> None:
        self.error = error
        self.posts: list[tuple[str, dict[str, Any]]] = []
        self.availability = Dependency("kubernetes")  # the real client reports through it

    def request(self, method: str, path: str, *, body: Any = None) -> dict[str, Any]:
        assert method == "POST"
        self.posts.append((path, body))
        if self.error is not None:
            raise KubeError(self.error)
        return {**body, "status": {"authenticated": True, "user": {"username": "u"}}}


def test_the_token_review_answer_leaves_only_its_status() -> None:
    client = FakeKubeClient()
    reviews = KubeReviews(client)  # type: ignore[arg-type]
    status = reviews.token_review(WRITER_TOKEN)
    assert status == {"authenticated": True, "user": {"username": "u"}}
    assert client.posts == [
        (
            "/apis/authentication.k8s.io/v1/tokenreviews",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenReview",
                "spec": {"token": WRITER_TOKEN},
            },
        )
    ]
    reviews.access_review({"user": "u", "resourceAttributes": {"verb": "get"}})
    path, body = client.posts[-1]
    assert path == "/apis/authorization.k8s.io/v1/subjectaccessreviews"
    assert body["kind"] == "SubjectAccessReview"


def test_a_failed_review_names_the_failure_but_not_the_token() -> None:
    client = FakeKubeClient(error=f"POST tokenreviews: 500 echo of {WRITER_TOKEN}")
    with pytest.raises(ReviewError) as failed:
        KubeReviews(client).token_review(WRITER_TOKEN)  # type: ignore[arg-type]
    assert str(failed.value) == "POST tokenreviews: 500 echo of [redacted]"
    assert failed.value.__cause__ is None
    assert failed.value.__suppress_context__


def test_kube_reviews_use_the_kube_client_type() -> None:
    assert KubeReviews.__init__.__annotations__["client"] in (KubeClient, "KubeClient")


ADMIN_SECRET = "ADMINTOKEN-0123456789abcdef"
# Careless files whose content a message once quoted: a token written as a key.
LEAKY = [
    [{"user": "admin", ADMIN_SECRET: "*"}],
    [{"user": "admin", "allow": ["*"], "tokens": {ADMIN_SECRET: "*"}}],
    [{"user": "admin", "allow": {ADMIN_SECRET: "*"}}],
    [{"user": "admin", "token": ADMIN_SECRET, "allow": [ADMIN_SECRET]}],
    [{"user": "admin", "token": ADMIN_SECRET, "groups": [{ADMIN_SECRET: 1}]}],
    {ADMIN_SECRET: {"user": "admin"}},
]


@pytest.mark.parametrize("content", LEAKY, ids=range(len(LEAKY)))
async def test_no_message_or_log_line_quotes_the_file(
    token_file: Path, content: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    tokens = StaticTokens(token_file)
    replace(token_file, content)
    with pytest.raises(AuthUnavailable) as refused:
        await tokens.authenticate(READER_TOKEN)
    assert str(token_file) in refused.value.message
    assert ADMIN_SECRET not in refused.value.message
    assert "static token file unusable" in caplog.text
    assert ADMIN_SECRET not in caplog.text


def test_the_503_quotes_nothing_of_the_file(make_app: Any, tmp_path: Path) -> None:
    api = make_app("static")
    replace(tmp_path / "tokens.json", [{"user": "admin", ADMIN_SECRET: "*"}])
    answer = api.put("/v1/nodes/n1", json={}, headers=bearer("anything-at-all-0000"))
    assert answer.status_code == 503, answer.text
    assert "0: an unknown key" in answer.json()["detail"]
    assert ADMIN_SECRET not in answer.text


@pytest.mark.parametrize(
    "grant",
    [
        "create\tadmissions",
        "create\u00a0admissions",
        "create\nadmissions",
        "* \u2003nodes",
        "create admissions\u200b",
    ],
)
async def test_a_grant_with_other_white_space_refuses_the_file(
    token_file: Path, grant: str
) -> None:
    tokens = StaticTokens(token_file)
    entries = [*STATIC_ENTRIES[:1], {**STATIC_ENTRIES[1], "allow": ["list nodes", grant]}]
    replace(token_file, entries)
    with pytest.raises(AuthUnavailable) as refused:
        await tokens.authenticate(WRITER_TOKEN)
    assert "1.allow.1: " in refused.value.message
    assert "separated by spaces" in refused.value.message


async def test_grants_with_more_spaces_still_grant(token_file: Path) -> None:
    tokens = StaticTokens(token_file)
    grants = ["create  admissions", " delete admissions ", " * "]
    replace(token_file, [{"user": "ci", "token": WRITER_TOKEN, "allow": grants}])
    ci = await tokens.authenticate(WRITER_TOKEN)
    assert (await tokens.authorize(ci, Permission("create", "admissions", "n1"))).allowed
    assert (await tokens.authorize(ci, Permission("update", "nodes", "n1"))).allowed


def test_a_review_while_the_api_server_is_away_is_marked_so() -> None:
    # Its failure is then a DEBUG line per request: the client logged the outage once.
    client = FakeKubeClient(error="POST tokenreviews: connection refused")
    reviews = KubeReviews(client)  # type: ignore[arg-type]
    with pytest.raises(ReviewError) as answered:
        reviews.token_review(WRITER_TOKEN)
    assert not answered.value.unavailable
    client.availability.failed("POST tokenreviews: connection refused")
    with pytest.raises(ReviewError) as away:
        reviews.access_review({"user": "u"})
    assert away.value.unavailable
