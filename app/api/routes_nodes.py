from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response

from app.api.deps import LedgerDep
from app.api.schemas import NAME_PATTERN, ErrorOut, HoldingOut, NodeIn, NodeOut
from app.auth.guard import AUTH_RESPONSES, path, require, require_read
from app.ledger.records import HolderKind

router = APIRouter(prefix="/v1", tags=["nodes"])
NodePath = Annotated[str, Path(pattern=NAME_PATTERN, max_length=253)]


@router.get("/nodes", dependencies=[require_read("list", "nodes")])
def list_nodes(ledger: LedgerDep) -> list[NodeOut]:
    return [NodeOut.of(v) for v in ledger.list_nodes()]


@router.get(
    "/nodes/{name}",
    responses={404: {"model": ErrorOut}},
    dependencies=[require_read("get", "nodes", name=path("name"))],
)
def get_node(name: NodePath, ledger: LedgerDep) -> NodeOut:
    return NodeOut.of(ledger.get_node(name))


@router.put(
    "/nodes/{name}",
    responses={201: {"model": NodeOut}, 409: {"model": ErrorOut}, **AUTH_RESPONSES},
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
    responses={404: {"model": ErrorOut}, 409: {"model": ErrorOut}, **AUTH_RESPONSES},
    dependencies=[require("delete", "nodes", name=path("name"))],
)
def delete_node(name: NodePath, ledger: LedgerDep) -> None:
    ledger.delete_node(name)


@router.get(
    "/holdings",
    tags=["holdings"],
    responses={404: {"model": ErrorOut}},
    dependencies=[require_read("list", "holdings")],
)
def list_holdings(
    ledger: LedgerDep,
    node: Annotated[str | None, Query(pattern=NAME_PATTERN, max_length=253)] = None,
    holder_kind: HolderKind | None = None,
) -> list[HoldingOut]:
    return [HoldingOut.of(h) for h in ledger.list_holdings(node, holder_kind)]
