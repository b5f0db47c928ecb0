"""Fixtures of the metrics tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.metrics.apps import App, MakeApp, start_app


@pytest.fixture
def make_app(sqlite_url: str) -> Iterator[MakeApp]:
    """make_app(gated=True, caps=KubeCaps(), per_node=True): see tests.metrics.apps."""
    apps: list[App] = []

    def make(**options: Any) -> App:
        apps.append(start_app(sqlite_url, **options))
        return apps[-1]

    yield make
    for app in apps:
        app.api.__exit__(None, None, None)
