"""FastAPI dependencies: the services built at start-up, taken from app.state."""

from __future__ import annotations

from typing import Annotated

# async: they only read app.state, and a sync dependency would cost a thread-pool hop.
from fastapi import Depends, Request

from app.admission.service import Admissions
from app.ledger.service import Ledger


async def _ledger(request: Request) -> Ledger:
    ledger: Ledger = request.app.state.services.ledger
    return ledger


async def _admissions(request: Request) -> Admissions:
    admissions: Admissions = request.app.state.services.admissions
    return admissions


LedgerDep = Annotated[Ledger, Depends(_ledger)]
AdmissionsDep = Annotated[Admissions, Depends(_admissions)]
