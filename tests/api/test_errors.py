"""One error shape for every route: each NodeledgerError a route can raise is answered by
the one handler with its code, status and retryable, and docs/api.md lists exactly those."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

import app.main  # noqa: F401  (every error class a route can raise is imported)
from app.api.answers import error_response
from app.bootstrap import build_services
from app.core.errors import DependencyError, NodeledgerError
from app.core.ledger_errors import LedgerError
from app.main import create_app
from app.metrics.registry import NO_METRICS
from app.settings import Settings
from app.slurm.errors import SlurmRequestError, SlurmUnavailable

API_DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"
ROW = re.compile(r"^\| `(\w+)` \| (\d{3}) \| (true|false) \|", re.MULTILINE)


def _subclasses(cls: type[NodeledgerError]) -> list[type[NodeledgerError]]:
    return [c for sub in cls.__subclasses__() for c in (sub, *_subclasses(sub))]


def answered_by_routes() -> dict[str, tuple[int, bool]]:
    """code -> (status, retryable) of every error a route may answer with: not the
    dependencies' (the gate turns them into refusals), not LedgerError itself (a base)."""
    found = {
        cls.code: (cls.http_status, cls.retryable)
        for cls in _subclasses(NodeledgerError)
        if not issubclass(cls, DependencyError) and cls is not LedgerError
    }
    return {**found, "invalid_request": (422, False)}  # also the schema's (app.api.errors)


def test_docs_list_every_code_a_route_answers_with() -> None:
    documented = {code: (int(s), r == "true") for code, s, r in ROW.findall(API_DOC.read_text())}
    assert documented == answered_by_routes()


@pytest.mark.parametrize(
    ("path", "status", "code", "detail"),
    [
        pytest.param(
            "/v1/slurm/job-hints", 409, "slurm_disabled", "NODELEDGER_SLURM_ENABLED", id="slurm-off"
        ),
        pytest.param(
            "/v1/extender/filter", 404, "kube_disabled", "NODELEDGER_KUBE_ENABLED", id="kube-off"
        ),
    ],
)
def test_a_route_of_an_integration_that_is_off_answers_in_the_error_shape(
    api: TestClient, path: str, status: int, code: str, detail: str
) -> None:
    body = {"job_ids": [1]} if "slurm" in path else {"Pod": {}, "NodeNames": ["n1"]}
    answer = api.post(path, json=body)
    assert answer.status_code == status, answer.text
    assert answer.json() == {
        "detail": answer.json()["detail"],
        "code": code,
        "retryable": False,
        "shortfalls": [],
    }
    assert detail in answer.json()["detail"]


def test_metrics_without_a_registry_and_an_unknown_asset_answer_in_the_error_shape(
    database_url: str,
) -> None:
    settings = Settings(database_url=database_url, migrate_on_start=False)
    services = replace(build_services(settings), metrics=NO_METRICS)
    with TestClient(create_app(settings, services)) as api:
        answers = [
            (api.get(path), code)
            for path, code in [
                ("/metrics", "metrics_disabled"),
                ("/ui/nothing.js", "asset_not_found"),
            ]
        ]
    for answer, code in answers:
        assert answer.status_code == 404, answer.text
        assert answer.json() == {
            "detail": answer.json()["detail"],
            "code": code,
            "retryable": False,
            "shortfalls": [],
        }


@pytest.mark.parametrize(
    ("error", "status", "retryable"),
    [
        pytest.param(SlurmUnavailable("slurmrestd unreachable"), 503, True, id="slurm-away"),
        pytest.param(SlurmRequestError("Slurm said no"), 502, False, id="slurm-refused"),
    ],
)
def test_a_dependency_error_reaching_a_route_would_be_a_502_or_a_retryable_503(
    error: NodeledgerError, status: int, retryable: bool
) -> None:
    answer = error_response(error)
    assert answer.status_code == status
    assert b'"retryable":' + (b"true" if retryable else b"false") in answer.body
