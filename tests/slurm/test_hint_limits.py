"""The hint routes bounded for any caller allowed ``create jobhints`` (app.slurm.hint_queue):
"every node" posts while one is pending cost no write and bring one full listing; beyond
the rate a post is 429 with Retry-After, and covered by that one full listing."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.bootstrap import Services, build_services
from app.db.engine import Database
from app.main import create_app
from app.settings import Settings
from app.slurm.hint_queue import HintQueue

FLOOD = 50


class CountedWrites:
    """The database as the queue uses it, counting its write transactions."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.writes = 0

    def read_statements(self) -> AbstractContextManager[Any]:
        return self.db.read_statements()

    def write_statements(self) -> AbstractContextManager[Any]:
        self.writes += 1
        return self.db.write_statements()


@pytest.fixture
def now() -> list[float]:
    return [0.0]  # the limiter's clock: time passes only when a test says so


@dataclass
class World:
    settings: Settings
    services: Services
    counted: CountedWrites

    def client(self, hints: HintQueue) -> TestClient:
        """The service with ``hints`` as its queue (as the Slurm integration has it)."""
        return TestClient(create_app(self.settings, replace(self.services, job_hints=hints)))


@pytest.fixture
def world(database_url: str) -> World:
    settings = Settings(database_url=database_url)
    services = build_services(settings)
    return World(settings, services, CountedWrites(services.db))


def test_every_node_posts_coalesce_into_one_listing(world: World) -> None:
    counted = world.counted
    hints = HintQueue(counted)  # type: ignore[arg-type]
    with world.client(hints) as api:
        for _ in range(FLOOD):
            answer = api.post("/v1/slurm/node-hints", json={"nodes": ["n1", "*"]})
            assert answer.status_code == 202, answer.text
        assert counted.writes == 1  # the first; the others found it pending
        assert hints.take_nodes() is None  # one full listing
        assert hints.take_nodes() == set()  # and no second
        assert api.post("/v1/slurm/node-hints", json={"nodes": ["*"]}).status_code == 202
        assert counted.writes == 3  # the take's delete, then a new one: nothing pending
        assert hints.take_nodes() is None


def test_beyond_the_rate_a_hint_is_429_and_covered_by_a_full_listing(
    world: World, now: list[float]
) -> None:
    counted = world.counted
    hints = HintQueue(counted, rate=2, monotonic=lambda: now[0])  # type: ignore[arg-type]
    with world.client(hints) as api:
        for job_id in range(1, 11):  # the burst: 5 seconds of the rate
            assert api.post("/v1/slurm/job-hints", json={"job_ids": [job_id]}).status_code == 202
        answers = [api.post("/v1/slurm/job-hints", json={"job_ids": [99]}) for _ in range(FLOOD)]
        answers.append(api.post("/v1/slurm/node-hints", json={"nodes": ["n2"]}))
        for answer in answers:
            assert answer.status_code == 429
            assert answer.headers["Retry-After"] == "1"
            assert answer.json() == {
                "detail": "more than 2 Slurm hints a second reached this replica: a full "
                "listing covers this one",
                "code": "too_many_hints",
                "retryable": True,
                "shortfalls": [],
            }
        assert counted.writes == 10 + 1  # the burst's, then one "every node" for the rest
        assert hints.take() == {str(j) for j in range(1, 11)}
        assert hints.take_nodes() is None  # job 99 and n2: read by the full listing
        now[0] += 0.5  # a token back
        assert api.post("/v1/slurm/node-hints", json={"nodes": ["n2"]}).status_code == 202
        assert hints.take_nodes() == {"n2"}
