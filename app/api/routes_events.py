from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query

from app.api.deps import LedgerDep
from app.api.schemas import NAME_PATTERN, EventOut
from app.ledger.errors import InvalidRequest
from app.ledger.records import EventKind

router = APIRouter(prefix="/v1", tags=["events"])


@router.get("/events")
def list_events(
    ledger: LedgerDep,
    node: Annotated[str | None, Query(pattern=NAME_PATTERN, max_length=253)] = None,
    kind: EventKind | None = None,
    since: Annotated[datetime | None, Query(description="RFC 3339 time, with zone")] = None,
    after: Annotated[int | None, Query(ge=0, description="Only events with a larger id")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[EventOut]:
    if since is not None and since.tzinfo is None:
        raise InvalidRequest("since: give a time zone, e.g. 2026-01-01T00:00:00Z")
    events = ledger.events(node=node, kind=kind, since=since, after_id=after, limit=limit)
    return [EventOut.of(e) for e in events]
