"""Keyset pages of GET /v1/nodes and GET /v1/holdings, on SQLite and PostgreSQL: every
item once across pages, even while nodes come and go; order by free; filter; bad input."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from fastapi.testclient import TestClient

from app.core.records import NodeSpec
from app.core.resources import Resources
from app.ledger.service import Ledger

GIB = 2**30
LINK = re.compile(r'^<(?P<url>/v1/[^>]+)>; rel="next"$')


def node(cpu: str = "8", memory: str = "16Gi", **extra: Any) -> dict[str, Any]:
    return {"capacity": {"cpu": cpu, "memory": memory}, **extra}


def pod(uid: str, on: str, cpu: str = "1", memory: str = "1Gi") -> dict[str, Any]:
    holder = {"kind": "pod", "namespace": "ns", "name": uid, "uid": uid}
    return {"node": on, "holder": holder, "requests": {"cpu": cpu, "memory": memory}}


def put(api: TestClient, name: str, body: dict[str, Any] | None = None) -> None:
    answer = api.put(f"/v1/nodes/{name}", json=body or node())
    assert answer.status_code in (200, 201), answer.text


def next_url(answer: httpx.Response) -> str | None:
    """The Link header's next page, checked against X-Next-Cursor."""
    link = answer.headers.get("link")
    if link is None:
        assert "x-next-cursor" not in answer.headers
        return None
    match = LINK.match(link)
    assert match, link
    url = match["url"]
    assert parse_qs(urlsplit(url).query)["cursor"] == [answer.headers["x-next-cursor"]]
    return url


def pages(
    api: TestClient, url: str, between: Callable[[int], None] = lambda _: None
) -> Iterator[list[dict[str, Any]]]:
    """Follow the Link headers from ``url``; ``between(n)`` runs after the n-th page."""
    number = 0
    next_page: str | None = url
    while next_page is not None:
        answer = api.get(next_page)
        assert answer.status_code == 200, answer.text
        yield answer.json()
        number += 1
        assert number < 1000, "the pages never end"
        next_page = next_url(answer)
        if next_page is not None:
            between(number)


def names(api: TestClient, url: str) -> list[str]:
    return [n["name"] for page in pages(api, url) for n in page]


def holder_ids(api: TestClient, url: str) -> list[str]:
    return [h["holder"]["id"] for page in pages(api, url) for h in page]


def test_pages_cover_every_node_once(api: TestClient) -> None:
    wanted = [f"n{i:02}" for i in range(23)]
    for name in reversed(wanted):
        put(api, name)
    sizes = [len(page) for page in pages(api, "/v1/nodes?limit=5")]
    assert sizes == [5, 5, 5, 5, 3]
    assert names(api, "/v1/nodes?limit=5") == wanted  # in name order, none twice
    assert names(api, "/v1/nodes?limit=23") == wanted
    exact = api.get("/v1/nodes?limit=23")
    assert "link" not in exact.headers  # no empty last page when the last one is full
    first = api.get("/v1/nodes", params={"limit": 5, "sort": "name", "q": "n"})
    assert first.headers["link"].startswith("</v1/nodes?")
    assert parse_qs(urlsplit(next_url(first) or "").query) == {
        "limit": ["5"],
        "sort": ["name"],
        "q": ["n"],
        "cursor": [first.headers["x-next-cursor"]],
    }


def test_default_page_is_500_nodes(api: TestClient, ledger: Ledger) -> None:
    spec = NodeSpec(capacity=Resources(1000, GIB, 0))
    for i in range(501):
        ledger.upsert_node(f"n{i:03}", spec)
    first = api.get("/v1/nodes")
    assert len(first.json()) == 500
    assert parse_qs(urlsplit(next_url(first) or "").query)["limit"] == ["500"]
    assert [n["name"] for page in pages(api, "/v1/nodes") for n in page][-1] == "n500"


@pytest.mark.parametrize("sort", ["name", "free_cpu"])
def test_nodes_present_throughout_are_seen_once_while_others_come_and_go(
    api: TestClient, sort: str
) -> None:
    stable = [f"n{i:03}" for i in range(0, 40, 2)]
    going = [f"n{i:03}" for i in range(1, 40, 2)]
    for name in stable + going:
        put(api, name)

    def churn(page: int) -> None:
        # Remove a node already seen and one not yet seen; add some on both sides of the
        # cursor (before every node, after it, after every node).
        for name in (going.pop(0), going.pop()) if going else ():
            assert api.delete(f"/v1/nodes/{name}").status_code == 204
        for name in (f"m{page}", f"n{page * 5:03}a", f"n{39 - page:03}b", f"z{page}"):
            put(api, name)

    seen = [n["name"] for page in pages(api, f"/v1/nodes?limit=3&sort={sort}", churn) for n in page]
    assert len(seen) == len(set(seen)), "a node was listed twice"
    assert set(stable) <= set(seen), f"skipped {sorted(set(stable) - set(seen))}"


def test_sort_by_free_is_most_free_first(api: TestClient) -> None:
    put(api, "big", node(cpu="64", memory="8Gi"))
    put(api, "mid", node(cpu="16", memory="64Gi"))
    put(api, "tie", node(cpu="16", memory="64Gi"))
    put(api, "full", node(cpu="4", memory="4Gi", reserved={"cpu": "1"}))
    put(api, "empty", node(cpu="2", memory="2Gi"))
    for uid, on, cpu in (("a", "big", "30"), ("b", "mid", "1500m"), ("c", "full", "3")):
        assert api.post("/v1/admissions", json=pod(uid, on, cpu=cpu)).status_code == 201
    # Overcommitted (free below zero): capacity forced under what is held.
    forced = api.put("/v1/nodes/full?force=true", json=node(cpu="2", memory="4Gi"))
    assert forced.status_code == 200, forced.text

    for sort, amount in (("free_cpu", "cpu_millis"), ("free_memory", "memory_bytes")):
        listed = [n for page in pages(api, f"/v1/nodes?limit=2&sort={sort}") for n in page]
        keys = [(-n["free"][amount], n["name"]) for n in listed]
        assert keys == sorted(keys), sort
        assert len(keys) == 5
    by_cpu = names(api, "/v1/nodes?limit=2&sort=free_cpu")
    assert by_cpu == ["big", "tie", "mid", "empty", "full"]  # 34, 16, 14.5, 2, -1 CPUs


def test_q_filters_by_name_and_slurm_name(api: TestClient) -> None:
    put(api, "alpha-1")
    put(api, "alpha-2")
    put(api, "beta-1")
    put(api, "gpu-7", node(slurm_name="alpha-gpu"))
    assert names(api, "/v1/nodes?q=alpha&limit=1") == ["alpha-1", "alpha-2", "gpu-7"]
    assert names(api, "/v1/nodes?q=ALPHA") == ["alpha-1", "alpha-2", "gpu-7"]
    assert names(api, "/v1/nodes?q=-1") == ["alpha-1", "beta-1"]
    assert names(api, "/v1/nodes?q=a_p") == []  # _ and % are plain characters
    for plain in ("%25", "%2F", "%5C", "%F0%9F%96%A5", "'"):  # % / \ an emoji '
        assert names(api, f"/v1/nodes?q={plain}") == []
    assert names(api, "/v1/nodes?q=alpha&sort=free_memory&limit=2") == [
        "alpha-1",
        "alpha-2",
        "gpu-7",
    ]


def test_holdings_pages(api: TestClient) -> None:
    for name in ("n1", "n2", "n3"):
        put(api, name)
    uids = [f"u{i}" for i in range(7)]
    for i, uid in enumerate(uids):
        assert api.post("/v1/admissions", json=pod(uid, f"n{i % 3 + 1}")).status_code == 201
    manual = {"kind": "manual", "id": "keep"}
    reserved = {"node": "n2", "holder": manual, "requests": {"cpu": "1"}}
    assert api.post("/v1/admissions", json=reserved).status_code == 201

    listed = [h for page in pages(api, "/v1/holdings?limit=2") for h in page]
    assert listed == api.get("/v1/holdings").json()  # same order as one big page
    keys = [(h["node"], h["holder"]["kind"], h["holder"]["id"]) for h in listed]
    assert keys == sorted(keys)
    assert len(keys) == 8
    assert holder_ids(api, "/v1/holdings?node=n2&limit=1") == ["keep", "u1", "u4"]
    assert sorted(holder_ids(api, "/v1/holdings?holder_kind=pod&limit=3")) == uids
    assert api.get("/v1/holdings?node=nope&limit=1").status_code == 404


def forged(document: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(document).encode()).decode().rstrip("=")


BAD_NODE_LISTINGS = [
    ("limit=0", "limit"),
    ("limit=1001", "limit"),
    ("limit=ten", "limit"),
    ("cursor=", "cursor"),
    ("cursor=not%20base64!", "cursor"),
    ("cursor=bm90IGpzb24", "cursor"),  # "not json"
    ("cursor=" + forged({"sort": "name", "name": "n1", "x": 1}), "cursor"),
    ("cursor=" + forged({"sort": "name", "name": "n1", "free": 3}), "cursor"),
    ("cursor=" + forged({"sort": "free_cpu", "name": "n1"}), "cursor"),
    ("cursor=" + forged({"sort": "free_cpu", "name": "n1", "free": 2**63}), "cursor"),
    ("cursor=" + forged({"sort": "name", "name": "n" + chr(0)}), "cursor"),
    ("cursor=" + forged({"sort": "name", "name": "n1"}) + "&sort=free_cpu", "cursor"),
    ("cursor=" + "A" * 1025, "cursor"),
    ("q=", "q"),
    ("q=%00", "q"),
    ("sort=free", "sort"),
]


def test_bad_node_listing_input_is_422_naming_the_field(api: TestClient) -> None:
    for query, field in BAD_NODE_LISTINGS:
        answer = api.get(f"/v1/nodes?{query}")
        assert answer.status_code == 422, (query, answer.text)
        assert [e["loc"] for e in answer.json()["detail"]] == [["query", field]], query


def test_cursors_do_not_cross_listings(api: TestClient) -> None:
    for name in ("n1", "n2"):
        put(api, name)
    node_cursor = api.get("/v1/nodes?limit=1").headers["x-next-cursor"]
    by_free = api.get("/v1/nodes?limit=1&sort=free_cpu").headers["x-next-cursor"]
    assert api.get(f"/v1/nodes?limit=1&sort=free_cpu&cursor={by_free}").status_code == 200
    for url in (
        f"/v1/holdings?cursor={node_cursor}",
        f"/v1/nodes?sort=free_memory&cursor={by_free}",
        f"/v1/nodes?cursor={by_free}",
        "/v1/holdings?limit=0",
    ):
        answer = api.get(url)
        assert answer.status_code == 422, url
        assert answer.json()["detail"][0]["loc"][0] == "query"
