from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from app.api.deps import LedgerDep
from app.api.schemas import NAME_PATTERN, EventOut, UtcTime
from app.auth.guard import require_read
from app.core.records import EventKind

router = APIRouter(prefix="/v1", tags=["events"], dependencies=[require_read("list", "events")])
MAX_EVENT_ID = 2**63 - 1  # a 64-bit id column: a larger cursor cannot even be compared


@router.get("/events")
def list_events(
    ledger: LedgerDep,
    node: Annotated[str | None, Query(pattern=NAME_PATTERN, max_length=253)] = None,
    kind: EventKind | None = None,
    since: Annotated[UtcTime | None, Query(description="RFC 3339 time, with zone")] = None,
    after: Annotated[
        int | None, Query(ge=0, le=MAX_EVENT_ID, description="Only events with a larger id")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[EventOut]:
    events = ledger.events(node=node, kind=kind, since=since, after_id=after, limit=limit)
    return [EventOut.of(e) for e in events]
