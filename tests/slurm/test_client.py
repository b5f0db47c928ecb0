"""The slurmrestd client against scripted answers (httpx.MockTransport)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.slurm.client import SlurmClient
from app.slurm.errors import (
    SlurmAnswerLost,
    SlurmAuthError,
    SlurmRequestError,
    SlurmUnavailable,
)
from app.slurm.payloads import newest_supported, parse_job, parse_node
from app.slurm.tokens import FileToken, StaticToken
from tests.support.fake_slurm import NODE, OPENAPI


def client(handler: Any, **kwargs: Any) -> SlurmClient:
    return SlurmClient(
        "http://slurm", StaticToken("t0k"), transport=httpx.MockTransport(handler), **kwargs
    )


def routes(**answers: Any) -> Any:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/openapi/v3":
            return httpx.Response(200, json=OPENAPI)
        answer = answers[request.url.path.split("/", 3)[-1]]
        return answer(request) if callable(answer) else answer

    handler.seen = seen  # type: ignore[attr-defined]
    return handler


def test_picks_newest_supported_version_and_sends_credentials() -> None:
    handler = routes(**{"nodes/": httpx.Response(200, json={"nodes": [NODE], "last_update": 7})})
    c = client(handler, user_name="slurm")
    listing = c.get_nodes()
    assert c.version == "v0.0.42"  # v0.0.46 is not one we know
    assert listing is not None
    assert listing.last_update == 7
    assert listing.items[0].alloc_cpus == 2
    request = handler.seen[-1]
    assert request.headers["X-SLURM-USER-TOKEN"] == "t0k"
    assert request.headers["X-SLURM-USER-NAME"] == "slurm"


@pytest.mark.parametrize(
    ("release", "offered", "picked"),
    [
        ("24.11", (40, 41, 42), "v0.0.42"),
        ("25.11", (41, 42, 43, 44), "v0.0.44"),
        ("26.05", (42, 43, 44, 45), "v0.0.45"),
        ("23.11", (39,), None),  # past its support window: refused, not guessed
    ],
)
def test_version_list_covers_24_11_to_26_05(
    release: str, offered: tuple[int, ...], picked: str | None
) -> None:
    assert newest_supported([f"/slurm/v0.0.{n}/ping/" for n in offered]) == picked


def test_unchanged_cluster_is_a_304_and_none() -> None:
    handler = routes(**{"nodes/": httpx.Response(304)})
    assert client(handler).get_nodes(update_time=5) is None
    assert handler.seen[-1].url.params["update_time"] == "5"


@pytest.mark.parametrize("status", [401, 511])
def test_auth_failures_are_auth_errors_and_not_retried(status: int) -> None:
    handler = routes(**{"nodes/": httpx.Response(status)})
    with pytest.raises(SlurmAuthError, match=str(status)):
        client(handler, retries=3).get_nodes()
    assert len(handler.seen) == 2  # openapi + one try


def test_slurm_errors_carry_number_and_description() -> None:
    error = {"error_number": 2018, "error": "Invalid node name specified", "description": "n9"}
    body = {"errors": [error]}
    handler = routes(**{"node/n9": httpx.Response(500, json=body)})
    with pytest.raises(SlurmRequestError) as info:
        client(handler, retries=3).update_node("n9", gres="k8scpu:1")
    assert info.value.errors[0].error_number == 2018
    assert "Invalid node name specified (2018): n9" in str(info.value)
    assert len(handler.seen) == 2  # an answer is never retried


def test_transport_failures_are_retried_then_unavailable() -> None:
    calls = 0

    def flaky(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, json={"nodes": [NODE]})

    assert client(routes(**{"node/n1": flaky}), retries=2).get_node("n1").name == "n1"
    calls = -10
    with pytest.raises(SlurmUnavailable, match="unreachable"):
        client(routes(**{"node/n1": flaky}), retries=1).get_node("n1")


def test_timeouts_are_unavailable() -> None:
    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    with pytest.raises(SlurmUnavailable, match="timed out"):
        client(routes(**{"node/n1": slow}), retries=0).get_node("n1")


@pytest.mark.parametrize(
    "lost",
    [
        pytest.param(lambda r: httpx.ReadTimeout("slow", request=r), id="read-timeout"),
        pytest.param(lambda r: httpx.RemoteProtocolError("cut", request=r), id="cut-off"),
    ],
)
def test_an_update_whose_answer_was_lost_is_not_retried(
    lost: Callable[[httpx.Request], Exception],
) -> None:
    """Issue 30: slurmrestd may still apply it, and a retry could land after a newer push."""
    calls = 0

    def answer_lost(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        raise lost(request)

    with pytest.raises(SlurmAnswerLost):
        client(routes(**{"node/n1": answer_lost}), retries=3).update_node("n1", gres="k8scpu:1")
    assert calls == 1
    calls = 0
    with pytest.raises(SlurmAnswerLost):  # a read is retried: it changes nothing
        client(routes(**{"node/n1": answer_lost}), retries=3).get_node("n1")
    assert calls == 4


def test_an_update_that_never_left_is_retried() -> None:
    calls = 0

    def refused_once(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, json={"errors": []})

    client(routes(**{"node/n1": refused_once}), retries=3).update_node("n1", gres="k8scpu:1")
    assert calls == 2


def test_update_sends_only_given_fields() -> None:
    handler = routes(**{"node/n1": httpx.Response(200, json={"errors": []})})
    client(handler).update_node("n1", gres="k8scpu:3")
    assert json.loads(handler.seen[-1].content) == {"gres": "k8scpu:3"}


def test_token_file_is_reread_when_rotated(tmp_path: Path) -> None:
    path = tmp_path / "jwt"
    path.write_text("first\n")
    tokens = FileToken(path)
    assert tokens.token() == "first"
    path.write_text("second-token\n")
    assert tokens.token() == "second-token"
    path.unlink()
    with pytest.raises(SlurmAuthError, match="token file"):
        tokens.token()


def test_job_payloads_of_old_and_new_versions_agree() -> None:
    v40 = {
        "job_id": 5, "name": "j", "job_state": ["RUNNING"], "tres_alloc_str": "cpu=4,mem=400M",
        "gres_detail": ["gpu:1(IDX:0)", ""],
        "job_resources": {"allocated_nodes": [
            {"nodename": "n1", "memory_allocated": 200}, {"nodename": "n2", "memory_allocated": 200}
        ]},
    }  # fmt: skip
    v41 = {
        "job_id": {"set": True, "number": 5}, "name": "j", "job_state": ["RUNNING"],
        "gres_detail": ["gpu:1(IDX:0)", ""],
        "job_resources": {"nodes": {"allocation": [
            {"name": "n1", "cpus": {"count": 2}, "memory": {"allocated": 200}},
            {"name": "n2", "cpus": {"count": 2}, "memory": {"allocated": 200}},
        ]}},
    }  # fmt: skip
    assert parse_job(v40) == parse_job(v41)
    assert parse_job(v41).allocations[0].gpus == 1


def test_nodes_changed_but_partitions_not_is_asked_again_in_full() -> None:
    def nodes(request: httpx.Request) -> httpx.Response:
        if "update_time" in request.url.params:
            error = {"error_number": -1, "error": "x", "description": "Unable to query partitions"}
            body = {"errors": [error]}
            return httpx.Response(500, json=body)
        return httpx.Response(200, json={"nodes": [NODE], "last_update": 9})

    listing = client(routes(**{"nodes/": nodes})).get_nodes(update_time=5)
    assert listing is not None
    assert listing.last_update == 9


def test_unchanged_jobs_are_none_although_slurm_answers_200() -> None:
    unchanged = httpx.Response(200, json={"jobs": [], "last_update": {"set": True, "number": 0}})
    assert client(routes(**{"jobs/": unchanged})).get_jobs(update_time=5) is None
    empty = httpx.Response(200, json={"jobs": [], "last_update": 12})
    listing = client(routes(**{"jobs/": empty})).get_jobs(update_time=5)
    assert listing is not None
    assert listing.items == ()


def test_listings_keep_only_the_fields_read_and_parse_as_whole_answers_do() -> None:
    running = {
        "job_id": {"set": True, "number": 7}, "name": "j", "user_name": "alice",
        "job_state": ["RUNNING"], "gres_detail": ["k8scpu(CNT:2)"], "tres_alloc_str": "cpu=2",
        "job_resources": {"select_type": ["CR_CORE_MEMORY"], "nodes": {"count": 1, "allocation": [
            {"index": 0, "name": "n1", "cpus": {"count": 2, "used": 0},
             "memory": {"used": 0, "allocated": 500},
             "sockets": [{"index": 0, "cores": [{"index": 0, "status": ["ALLOCATED"]}]}]},
        ]}},
        "script": None, "array_job_id": {"set": False}, "comment": 3,  # never read
    }  # fmt: skip
    pending = {"job_id": 8, "name": "p", "job_state": "PENDING", "job_resources": None}
    jobs = [running, pending]
    nodes = [{**NODE, "features": ["a"], "energy": {"watts": 1}}]
    answers = {
        "jobs/": httpx.Response(200, json={"jobs": jobs, "last_update": 3, "meta": {}}),
        "nodes/": httpx.Response(200, json={"nodes": nodes, "last_update": 4}),
    }
    c = client(routes(**answers))
    listed_jobs, listed_nodes = c.get_jobs(), c.get_nodes()
    assert listed_jobs is not None
    assert listed_nodes is not None
    assert listed_jobs.items == tuple(parse_job(j) for j in jobs)
    assert listed_nodes.items == (parse_node(NODE),)
    assert listed_jobs.items[0].allocations[0].memory_mb == 500


def test_a_listing_of_another_shape_is_unavailable_naming_the_call() -> None:
    odd = httpx.Response(200, json={"jobs": "all of them"})
    with pytest.raises(SlurmUnavailable, match=r"GET /slurm/v0\.0\.42/jobs/: answer is not JSON"):
        client(routes(**{"jobs/": odd}), retries=0).get_jobs()
