"""Applications with authentication on: static tokens, or Kubernetes reviews (a fake)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.auth.settings import AuthSettings
from app.bootstrap import build_guard
from app.main import create_app
from app.settings import Settings
from tests.auth.fakes import STATIC_ENTRIES, FakeReviews, write_tokens

MakeApp = Callable[..., TestClient]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def reviews() -> FakeReviews:
    return FakeReviews()


@pytest.fixture
def make_app(sqlite_url: str, tmp_path: Path, reviews: FakeReviews) -> Iterator[MakeApp]:
    """make_app(mode, **auth settings): a started TestClient on a fresh SQLite ledger."""
    clients: list[TestClient] = []

    def make(mode: str, **auth: object) -> TestClient:
        if mode == "static":
            auth.setdefault("token_file", write_tokens(tmp_path / "tokens.json", STATIC_ENTRIES))
        settings = Settings(
            database_url=sqlite_url,
            migrate_on_start=False,
            auth=AuthSettings(mode=mode, **auth),  # type: ignore[arg-type]
        )
        guard = build_guard(settings, reviews=reviews)
        client = TestClient(create_app(settings, guard=guard))
        clients.append(client.__enter__())
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)
