"""The page's files as served (no browser): same-origin only, each reference answered, the
security headers, nothing else reachable under /ui/."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings


@pytest.fixture
def client(sqlite_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(database_url=sqlite_url))) as client:
        yield client


def test_the_page_and_everything_it_references_are_served_from_here(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    assert "default-src 'none'" in page.headers["content-security-policy"]
    assert "<title>nodeledger</title>" in page.text
    references = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert "/ui/app.js" in references
    assert "/ui/app.css" in references
    for reference in references:
        assert reference.startswith(("/", "data:")), f"{reference} is not from this origin"
        if reference.startswith("/ui/"):
            answer = client.get(reference)
            assert answer.status_code == 200, reference
            assert answer.headers["cache-control"] == "no-cache"
    assert client.get("/ui/app.js").headers["content-type"].startswith("text/javascript")
    assert client.get("/ui/app.css").headers["content-type"].startswith("text/css")


def test_only_the_assets_are_served(client: TestClient) -> None:
    for path in ("/ui/index.html", "/ui/routes.py", "/ui/..%2Froutes.py", "/ui/"):
        assert client.get(path).status_code == 404, path
    assert not any(
        p == "/" or p.startswith("/ui") for p in client.get("/openapi.json").json()["paths"]
    )
