"""No token, token-file content or query-string secret in any answer or log line, at any
level (issue #19): the real `nodeledger serve` at --log-level debug, in both log formats,
in static mode with a careless token file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest

from app.logs import QUERY_SHOWN, redact_query
from app.settings import Settings
from tests.auth.fakes import READER_TOKEN, STATIC_ENTRIES, WRITER_TOKEN, bearer, write_tokens
from tests.support.databases import sqlite_database
from tests.support.service import running_service

ADMIN_SECRET = "ADMINTOKEN-0123456789abcdef"
QUERY_SECRET = "QUERYSECRET-fedcba9876543210"


@pytest.mark.slow
@pytest.mark.parametrize("log_format", ["text", "json"])
def test_debug_logs_and_answers_hold_no_secret(tmp_path: Path, log_format: str) -> None:
    tokens = write_tokens(tmp_path / "tokens.json", STATIC_ENTRIES)
    env = {
        "NODELEDGER_LOG_LEVEL": "debug",
        "NODELEDGER_LOG_FORMAT": log_format,
        "NODELEDGER_AUTH_MODE": "static",
        "NODELEDGER_AUTH_TOKEN_FILE": str(tokens),
    }
    answers: list[str] = []
    with (
        running_service(sqlite_database(tmp_path), tmp_path, env=env) as service,
        httpx.Client(base_url=service.url, timeout=10) as http,
    ):
        queries = (f"access_token={QUERY_SECRET}", f"node=n1&{QUERY_SECRET}", f"x={QUERY_SECRET}")
        for query in queries:
            answer = http.get(f"/v1/nodes?{query}", headers=bearer(READER_TOKEN))
            answers.append(answer.text)
            assert answer.status_code == 200, answer.text
        refused = http.put("/v1/nodes/n1", json={}, headers=bearer(ADMIN_SECRET))
        assert refused.status_code == 401
        # A token written as a key of the file: every caller is refused, naming the place.
        replaced = tokens.with_suffix(".new")
        replaced.write_text(json.dumps([{"user": "admin", ADMIN_SECRET: "*"}]))
        os.replace(replaced, tokens)
        for token in (WRITER_TOKEN, ADMIN_SECRET, "anything-at-all-0000"):
            broken = http.put("/v1/nodes/n1", json={}, headers=bearer(token))
            assert broken.status_code == 503, broken.text
            answers.append(broken.text)
        log = service.log()
    assert "GET /v1/nodes?" in log  # the access lines are there, their secrets are not
    assert "static token file unusable" in log
    for secret in (ADMIN_SECRET, QUERY_SECRET, WRITER_TOKEN, READER_TOKEN):
        assert secret not in log
        assert not any(secret in answer for answer in answers)


def test_the_shown_query_parameters_are_the_apis_own(tmp_path: Path) -> None:
    from app.main import create_app

    app = create_app(Settings(database_url=sqlite_database(tmp_path)))
    names = {
        parameter["name"]
        for operations in app.openapi()["paths"].values()
        for operation in operations.values()
        for parameter in operation.get("parameters", [])
        if parameter["in"] == "query"
    }
    assert names == QUERY_SHOWN


@pytest.mark.parametrize(
    ("target", "logged"),
    [
        ("/v1/nodes", "/v1/nodes"),
        ("/v1/nodes?node=n1&limit=5", "/v1/nodes?node=n1&limit=5"),
        ("/v1/nodes?access_token=s3cret&node=n1", "/v1/nodes?[redacted]&node=n1"),
        ("/v1/nodes?s3cret", "/v1/nodes?[redacted]"),
        ("/v1/nodes?node=n1&node%5B%5D=s3cret", "/v1/nodes?node=n1&[redacted]"),
    ],
)
def test_query_values_of_unknown_parameters_are_redacted(target: str, logged: str) -> None:
    assert redact_query(target) == logged
