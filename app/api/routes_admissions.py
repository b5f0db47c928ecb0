from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response
from fastapi.concurrency import run_in_threadpool

from app.api.deps import AdmissionsDep
from app.api.schemas import AdmissionIn, ErrorOut, HoldingOut
from app.ledger.records import HolderKind

router = APIRouter(prefix="/v1", tags=["admissions"])


@router.post(
    "/admissions",
    status_code=201,
    responses={
        200: {"model": HoldingOut, "description": "Already admitted (same holder)"},
        404: {"model": ErrorOut},
        409: {"model": ErrorOut, "description": "Does not fit, or holder conflict"},
    },
)
async def admit(body: AdmissionIn, admissions: AdmissionsDep, response: Response) -> HoldingOut:
    # async with one explicit worker-thread hop for the blocking ledger/Slurm work: a sync
    # endpoint would also hop for response validation (the hot path's main overhead).
    admission = await run_in_threadpool(
        admissions.admit, body.node, body.holder.holder(), body.requests.resources()
    )
    if not admission.created:
        response.status_code = 200
    return HoldingOut.of(admission.holding)


@router.delete("/admissions/{holder_uid}", responses={404: {"model": ErrorOut}})
async def release(
    holder_uid: Annotated[str, Path(min_length=1, max_length=253)],
    admissions: AdmissionsDep,
    kind: Annotated[HolderKind | None, Query(description="pod or manual; default either")] = None,
) -> HoldingOut:
    return HoldingOut.of(await run_in_threadpool(admissions.release, holder_uid, kind))
