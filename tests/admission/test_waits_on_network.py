"""The REST admission routes hop to a worker thread only for what may wait on another
host (app.admission.service, ``Admissions._from_event_loop``): on SQLite the ledger's
work runs on the event loop and only the gate's confirmation hops; on PostgreSQL the
whole admission or release takes one hop."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest

from app.admission import service
from app.admission.service import AdmissionRequest, Admissions, ReleaseRequest
from app.core.records import Holder, HolderKind, Holding, NodeSpec
from app.core.resources import Resources
from app.db.engine import Database
from app.ledger.service import Ledger

POD = Holder(HolderKind.POD, "uid-1", "ns/p1")


class _Gate:
    def confirm(self, holding: Holding) -> None:
        """Agrees with everything."""

    def changed(self, node: str) -> None:
        """Nothing to tell."""

    def headroom_open(self, node: str) -> bool:
        return False

    def released(self, holding: Holding) -> None:
        """No hold job."""

    def defer_push(self, node: str, reason: str, *, settle: float = 0.0) -> None:
        """No headroom."""


@pytest.mark.parametrize("gated", [False, True], ids=["no gate", "gate"])
def test_only_what_waits_on_another_host_hops(
    database: Database, gated: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    hops: list[str] = []
    run_sync = service.to_thread.run_sync

    async def counted(call: Callable[..., Any], *args: Any) -> Any:
        hops.append(getattr(call, "__name__", type(call).__name__))
        return await run_sync(call, *args)

    monkeypatch.setattr(service.to_thread, "run_sync", counted)
    ledger = Ledger(database)
    ledger.upsert_node("n1", NodeSpec(Resources(8000, 2**34, 0)))
    admissions = Admissions(ledger, _Gate() if gated else None)

    async def admit_and_release() -> None:
        admitted = await admissions.admit_async(AdmissionRequest("n1", POD, Resources(1000, 0)))
        assert admitted.created
        released = await admissions.release_async(ReleaseRequest(POD.id))
        assert released.holder == POD

    anyio.run(admit_and_release)
    if not database.is_sqlite:
        assert hops == ["inline", "inline"]  # each flow whole in one worker thread
    elif gated:
        assert hops == ["partial", "partial"]  # the gate's confirm, the release's push
    else:
        assert hops == []
