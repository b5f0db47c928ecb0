"""Paginated LISTs (limit + continue) with a fake API server: every object once, the
snapshot's resourceVersion, a fresh start when a continue token expired (410), and pages
parsed into a shape."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, TypedDict

import pytest

from app.kube.client import LIST_ATTEMPTS, KubeClient, KubeError


@dataclass
class Response:
    data: bytes


class PagedServer(KubeClient):
    """Serves ``count`` objects in pages of ``limit``; each list (a request without a
    continue token) is a new snapshot with the next resourceVersion. Continue requests
    listed in ``expire`` (by number, 1-based, across the whole run) answer 410."""

    def __init__(self, count: int, page_size: int, expire: set[int] | None = None) -> None:
        self.page_size = page_size  # no API client: _call() is all a list uses
        self.timeout = 10
        self.count = count
        self.expire = expire or set()
        self.snapshots = 0
        self.continues = 0
        self.queries: list[dict[str, Any]] = []

    def _call(self, method: str, path: str, query: dict[str, Any] | None, *args: Any) -> Any:
        query = dict(query or {})
        self.queries.append(query)
        limit = int(query["limit"])
        token = query.get("continue")
        if token is None:
            self.snapshots += 1
            start, snapshot = 0, self.snapshots
        else:
            self.continues += 1
            if self.continues in self.expire:
                raise KubeError(f"GET {path}: 410 The provided continue parameter is too old", 410)
            snapshot, start = (int(part) for part in token.split(":"))
        end = min(start + limit, self.count)
        items = [
            {"metadata": {"name": f"o{i}", "snapshot": snapshot, "managedFields": [{"x": i}]}}
            for i in range(start, end)
        ]
        meta = {"resourceVersion": str(100 + snapshot)}
        if end < self.count:
            meta["continue"] = f"{snapshot}:{end}"
        return Response(json.dumps({"kind": "List", "metadata": meta, "items": items}).encode())


def name_and_snapshot(obj: dict[str, Any]) -> tuple[str, int]:
    return obj["metadata"]["name"], obj["metadata"]["snapshot"]


def test_every_page_is_read_and_each_object_returned_once() -> None:
    server = PagedServer(25, page_size=4)
    items, version = server.list("/things", name_and_snapshot, labelSelector="a=b")
    assert [name for name, _ in items] == [f"o{i}" for i in range(25)]
    assert version == "101"
    assert len(server.queries) == 7  # ceil(25 / 4)
    assert all(q["limit"] == "4" and q["labelSelector"] == "a=b" for q in server.queries)


class _Meta(TypedDict, total=False):
    name: str
    snapshot: int


class Shape(TypedDict, total=False):
    metadata: _Meta


def test_a_shape_keeps_only_its_fields() -> None:
    server = PagedServer(5, page_size=2)
    items, version = server.list("/things", lambda obj: obj, Shape)
    assert items == [{"metadata": {"name": f"o{i}", "snapshot": 1}} for i in range(5)]
    assert version == "101"


def test_an_expired_continue_token_starts_the_list_again() -> None:
    server = PagedServer(10, page_size=3, expire={1})  # the second page of the first list
    items, version = server.list("/things", name_and_snapshot, Shape)
    # Only the second snapshot's objects, each once, and its resourceVersion to watch from.
    assert items == [(f"o{i}", 2) for i in range(10)]
    assert version == "102"
    assert server.snapshots == 2


def test_a_list_that_keeps_expiring_gives_up_with_410() -> None:
    server = PagedServer(10, page_size=3, expire=set(range(1, 100)))
    with pytest.raises(KubeError) as raised:
        server.list("/things", name_and_snapshot)
    assert raised.value.status == 410
    assert server.snapshots == LIST_ATTEMPTS


def test_other_errors_are_not_retried() -> None:
    class Broken(PagedServer):
        def _call(self, method: str, path: str, query: dict[str, Any] | None, *args: Any) -> Any:
            if (query or {}).get("continue"):
                raise KubeError("GET /things: 500 etcd is down", 500)
            return super()._call(method, path, query, *args)

    server = Broken(10, page_size=3)
    with pytest.raises(KubeError) as raised:
        server.list("/things", name_and_snapshot)
    assert raised.value.status == 500
    assert server.snapshots == 1


def test_a_page_that_does_not_fit_its_shape_is_an_error() -> None:
    class Odd(PagedServer):
        def _call(self, *args: Any) -> Any:
            return Response(b'{"metadata": {"resourceVersion": "1"}, "items": [{"metadata": 7}]}')

    with pytest.raises(KubeError, match="unreadable list page"):
        Odd(1, page_size=3).list("/things", name_and_snapshot, Shape)
