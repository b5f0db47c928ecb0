from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError

from app.api import links
from app.api.cursors import holding_cursor, holding_key, node_cursor, node_key
from app.api.deps import LedgerDep
from app.api.schemas import (
    NAME_PATTERN,
    NO_NUL,
    ErrorOut,
    HoldingOut,
    NodeIn,
    NodeOut,
)
from app.auth.guard import path, require, require_read
from app.core.records import HolderKind
from app.ledger.paging import HoldingKey, NodeKey, NodeSort

router = APIRouter(prefix="/v1", tags=["nodes"])
NodePath = Annotated[str, Path(pattern=NAME_PATTERN, max_length=253)]

# Listings come in keyset pages: a client that wants everything follows the Link header.
DEFAULT_PAGE = 500
Limit = Annotated[int, Query(ge=1, le=1000, description="At most this many items (1-1000)")]
Cursor = Annotated[
    str | None,
    Query(
        min_length=1,
        max_length=1024,
        pattern=r"^[A-Za-z0-9_-]+$",
        description="Where to continue: X-Next-Cursor of the previous page (opaque)",
    ),
]
PAGED: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "One page; Link and X-Next-Cursor when there is more",
        "headers": {
            "Link": {
                "description": '<the next page>; rel="next", only when there is more',
                "schema": {"type": "string"},
            },
            "X-Next-Cursor": {
                "description": "The cursor of the next page, only when there is more",
                "schema": {"type": "string"},
            },
        },
    }
}
K = TypeVar("K")


def _after(parse: Callable[[str], K], cursor: str | None) -> K | None:
    """The key a cursor carries; a cursor that does not parse is a 422 naming it."""
    if cursor is None:
        return None
    try:
        return parse(cursor)
    except ValueError as exc:
        error = {"type": "value_error", "loc": ("query", "cursor"), "input": cursor}
        raise RequestValidationError(
            [{**error, "msg": f"Value error, {exc}", "ctx": {"error": str(exc)}}]
        ) from None


def _link_next(request: Request, response: Response, limit: int, cursor: str | None) -> None:
    """Point at the next page with the request's own filters, when there is one."""
    if cursor is None:
        return
    url = request.url.include_query_params(limit=limit, cursor=cursor)
    response.headers["Link"] = f'<{url.path}?{url.query}>; rel="next"'
    response.headers["X-Next-Cursor"] = cursor


@dataclass(frozen=True, slots=True)
class NodeListing:
    limit: int
    after: NodeKey | None
    q: str | None
    sort: NodeSort


async def _node_listing(
    limit: Limit = DEFAULT_PAGE,
    cursor: Cursor = None,
    q: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=253,
            pattern=NO_NUL,
            description="Only nodes whose name or slurm_name contains this (any case)",
        ),
    ] = None,
    sort: Annotated[
        NodeSort,
        Query(description="name; free_cpu or free_memory: most free first, ties by name"),
    ] = NodeSort.NAME,
) -> NodeListing:
    return NodeListing(limit, _after(lambda c: node_key(c, sort), cursor), q, sort)


@dataclass(frozen=True, slots=True)
class HoldingListing:
    limit: int
    after: HoldingKey | None


async def _holding_listing(limit: Limit = DEFAULT_PAGE, cursor: Cursor = None) -> HoldingListing:
    return HoldingListing(limit, _after(holding_key, cursor))


@router.get("/nodes", responses=PAGED, dependencies=[require_read("list", "nodes")])
def list_nodes(
    ledger: LedgerDep,
    request: Request,
    response: Response,
    listing: Annotated[NodeListing, Depends(_node_listing)],
) -> list[NodeOut]:
    page = ledger.node_page(
        listing.limit, after=listing.after, name_contains=listing.q, sort=listing.sort
    )
    cursor = None if page.next is None else node_cursor(page.next, listing.sort)
    _link_next(request, response, listing.limit, cursor)
    return [NodeOut.of(v) for v in page.items]


@router.get(
    "/nodes/{name}",
    responses={404: {"model": ErrorOut}},
    dependencies=[require_read("get", "nodes", name=path("name"))],
)
def get_node(name: NodePath, ledger: LedgerDep) -> NodeOut:
    return NodeOut.of(ledger.get_node(name))


@router.put(
    "/nodes/{name}",
    responses={
        200: {"description": "Updated", "links": links.NODE},
        201: {"model": NodeOut, "description": "Created", "links": links.NODE},
        409: {"model": ErrorOut},
    },
    dependencies=[require("update", "nodes", name=path("name"))],
)
def put_node(
    name: NodePath,
    body: NodeIn,
    ledger: LedgerDep,
    response: Response,
    force: Annotated[bool, Query(description="Allow capacity below what is held")] = False,
) -> NodeOut:
    view, created = ledger.upsert_node(
        name, body.spec(), cordon_reason=body.cordon_reason, force=force
    )
    response.status_code = 201 if created else 200
    return NodeOut.of(view)


@router.delete(
    "/nodes/{name}",
    status_code=204,
    responses={404: {"model": ErrorOut}, 409: {"model": ErrorOut}},
    dependencies=[require("delete", "nodes", name=path("name"))],
)
def delete_node(name: NodePath, ledger: LedgerDep) -> None:
    ledger.delete_node(name)


@router.get(
    "/holdings",
    tags=["holdings"],
    responses={**PAGED, 404: {"model": ErrorOut}},
    dependencies=[require_read("list", "holdings")],
)
def list_holdings(
    ledger: LedgerDep,
    request: Request,
    response: Response,
    listing: Annotated[HoldingListing, Depends(_holding_listing)],
    node: Annotated[str | None, Query(pattern=NAME_PATTERN, max_length=253)] = None,
    holder_kind: HolderKind | None = None,
) -> list[HoldingOut]:
    page = ledger.holdings_page(listing.limit, node=node, kind=holder_kind, after=listing.after)
    cursor = None if page.next is None else holding_cursor(page.next)
    _link_next(request, response, listing.limit, cursor)
    return [HoldingOut.of(h) for h in page.items]
