"""Pagination cursors of the REST API's listings.

A cursor is opaque to clients: base64url of the JSON key where the previous page ended
(app.ledger.paging), checked like any other input when it comes back.
"""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Self, TypeVar

from pydantic import BaseModel, Field, model_validator

from app.api.schemas import NO_NUL, StrictModel
from app.core.records import HolderKind
from app.ledger.paging import HoldingKey, NodeKey, NodeSort

BigInt = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]  # what a BIGINT column compares
KeyText = Annotated[str, Field(max_length=253, pattern=NO_NUL)]


class _NodeCursor(StrictModel):
    sort: NodeSort
    name: KeyText
    free: BigInt | None = None

    @model_validator(mode="after")
    def _free_iff_sorted_by_free(self) -> Self:
        if (self.free is None) != (self.sort is NodeSort.NAME):
            raise ValueError("free goes with a sort by free")
        return self


class _HoldingCursor(StrictModel):
    node: KeyText
    kind: HolderKind
    id: KeyText


_Cursor = TypeVar("_Cursor", _NodeCursor, _HoldingCursor)


def _encode(cursor: BaseModel) -> str:
    raw = cursor.model_dump_json(exclude_none=True).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode(cursor: str, model: type[_Cursor]) -> _Cursor:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        return model.model_validate_json(raw)
    except (ValueError, binascii.Error):  # pydantic's ValidationError is a ValueError
        raise ValueError("not a cursor this API gave out (take it from X-Next-Cursor)") from None


def node_cursor(key: NodeKey, sort: NodeSort) -> str:
    return _encode(_NodeCursor(sort=sort, name=key.name, free=key.free))


def node_key(cursor: str, sort: NodeSort) -> NodeKey:
    """The key a node cursor carries; ValueError for anything this API did not give out
    for ``sort``."""
    decoded = _decode(cursor, _NodeCursor)
    if decoded.sort is not sort:
        raise ValueError(f"this cursor continues a listing with sort={decoded.sort.value}")
    return NodeKey(decoded.name, decoded.free)


def holding_cursor(key: HoldingKey) -> str:
    return _encode(_HoldingCursor(node=key.node, kind=key.holder_kind, id=key.holder_id))


def holding_key(cursor: str) -> HoldingKey:
    decoded = _decode(cursor, _HoldingCursor)
    return HoldingKey(decoded.node, decoded.kind, decoded.id)
