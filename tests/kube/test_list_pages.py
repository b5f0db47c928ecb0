"""Paginated LISTs (limit + continue) with a fake API server: every object once, the
snapshot's resourceVersion, and a fresh start when a continue token expired (410)."""

from __future__ import annotations

from typing import Any

import pytest

from app.kube.client import LIST_ATTEMPTS, KubeClient, KubeError


class PagedServer(KubeClient):
    """Serves ``count`` objects in pages of ``limit``; each list (a request without a
    continue token) is a new snapshot with the next resourceVersion. Continue requests
    listed in ``expire`` (by number, 1-based, across the whole run) answer 410."""

    def __init__(self, count: int, page_size: int, expire: set[int] | None = None) -> None:
        self.page_size = page_size  # no API client: request() is all the list uses
        self.count = count
        self.expire = expire or set()
        self.snapshots = 0
        self.continues = 0
        self.requests: list[dict[str, Any]] = []

    def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        query = dict(kwargs.get("query") or {})
        self.requests.append(query)
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
        items = [{"metadata": {"name": f"o{i}", "snapshot": snapshot}} for i in range(start, end)]
        meta = {"resourceVersion": str(100 + snapshot)}
        if end < self.count:
            meta["continue"] = f"{snapshot}:{end}"
        return {"metadata": meta, "items": items}


def name_and_snapshot(obj: dict[str, Any]) -> tuple[str, int]:
    return obj["metadata"]["name"], obj["metadata"]["snapshot"]


def test_every_page_is_read_and_each_object_returned_once() -> None:
    server = PagedServer(25, page_size=4)
    items, version = server.list("/things", name_and_snapshot, labelSelector="a=b")
    assert [name for name, _ in items] == [f"o{i}" for i in range(25)]
    assert version == "101"
    assert len(server.requests) == 7  # ceil(25 / 4)
    assert all(q["limit"] == "4" and q["labelSelector"] == "a=b" for q in server.requests)


def test_an_expired_continue_token_starts_the_list_again() -> None:
    server = PagedServer(10, page_size=3, expire={1})  # the second page of the first list
    items, version = server.list("/things", name_and_snapshot)
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
        def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
            if (kwargs.get("query") or {}).get("continue"):
                raise KubeError("GET /things: 500 etcd is down", 500)
            return super().request(method, path, **kwargs)

    server = Broken(10, page_size=3)
    with pytest.raises(KubeError) as raised:
        server.list("/things", name_and_snapshot)
    assert raised.value.status == 500
    assert server.snapshots == 1
