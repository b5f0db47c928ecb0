"""Real `nodeledger serve` processes racing over HTTP: one replica, or two sharing one
database, never admit more than a node has."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from tests.support.service import ServiceProcess, running_service


@pytest.fixture(params=[1, 2], ids=["one-replica", "two-replicas"])
def replicas(
    request: pytest.FixtureRequest, database_url: str, tmp_path: Path
) -> Iterator[list[ServiceProcess]]:
    with ExitStack() as stack:
        yield [
            stack.enter_context(running_service(database_url, tmp_path, name=f"replica{i}"))
            for i in range(request.param)
        ]


def test_64_concurrent_http_admissions_admit_exactly_8(replicas: list[ServiceProcess]) -> None:
    first = replicas[0].url
    node = {"capacity": {"cpu": "8", "memory": "64Gi"}}
    assert httpx.put(f"{first}/v1/nodes/n1", json=node).status_code == 201

    def admit(i: int) -> int:
        body = {
            "node": "n1",
            "holder": {"kind": "pod", "uid": f"u{i}"},
            "requests": {"cpu": "1", "memory": "1Gi"},
        }
        url = replicas[i % len(replicas)].url
        return httpx.post(f"{url}/v1/admissions", json=body, timeout=60).status_code

    with ThreadPoolExecutor(max_workers=64) as pool:
        codes = list(pool.map(admit, range(64)))
    assert codes.count(201) == 8, codes
    assert codes.count(409) == 56, codes
    for replica in replicas:
        view = httpx.get(f"{replica.url}/v1/nodes/n1").json()
        assert view["free"]["cpu_millis"] == 0
        assert len(view["holdings"]) == 8


def test_same_uid_racing_on_replicas_yields_one_holding(replicas: list[ServiceProcess]) -> None:
    first = replicas[0].url
    httpx.put(f"{first}/v1/nodes/n1", json={"capacity": {"cpu": "8", "memory": "64Gi"}})
    body = {"node": "n1", "holder": {"kind": "pod", "uid": "same"}, "requests": {"cpu": "1"}}

    def admit(i: int) -> int:
        url = replicas[i % len(replicas)].url
        return httpx.post(f"{url}/v1/admissions", json=body, timeout=60).status_code

    with ThreadPoolExecutor(max_workers=16) as pool:
        codes = list(pool.map(admit, range(16)))
    assert codes.count(201) == 1, codes
    assert codes.count(200) == 15, codes
    assert len(httpx.get(f"{first}/v1/holdings").json()) == 1


def test_racing_admissions_of_one_gpu_device_admit_exactly_one(
    replicas: list[ServiceProcess],
) -> None:
    """Issue 23: eight pods at once ask for GPU device 1 of a node with room for two GPUs
    by count; exactly one gets it, the others are told it is held."""
    first = replicas[0].url
    node = {"capacity": {"cpu": "8", "memory": "64Gi", "gpu": 2}}
    assert httpx.put(f"{first}/v1/nodes/n1", json=node).status_code == 201

    def admit(i: int) -> tuple[int, str]:
        body = {
            "node": "n1",
            "holder": {"kind": "pod", "uid": f"u{i}"},
            "requests": {"cpu": "1", "gpu": 1},
            "devices": [{"index": 1}],
        }
        url = replicas[i % len(replicas)].url
        answer = httpx.post(f"{url}/v1/admissions", json=body, timeout=60)
        return answer.status_code, answer.json().get("code", "")

    with ThreadPoolExecutor(max_workers=8) as pool:
        outcomes = list(pool.map(admit, range(8)))
    assert sorted(outcomes) == [(201, "")] + [(409, "device_taken")] * 7, outcomes
    holdings = httpx.get(f"{first}/v1/holdings").json()
    assert [h["devices"] for h in holdings] == [[{"index": 1, "uuid": ""}]]
