from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query, Request, Response
from pydantic import TypeAdapter

from app.admission.service import AdmissionRequest, Admissions, ReleaseRequest
from app.api import links
from app.api.deps import AdmissionsDep
from app.api.schemas import HOLDER_ID_PATTERN, AdmissionIn, ErrorOut, HoldingOut
from app.auth.guard import body, path, require
from app.core.records import HolderKind

router = APIRouter(prefix="/v1", tags=["admissions"])
# What FastAPI serializes the admission's answer with (its response_model).
_HOLDING_JSON = TypeAdapter(HoldingOut)


@router.post(
    "/admissions",
    status_code=201,
    response_model=HoldingOut,
    responses={
        200: {
            "model": HoldingOut,
            "description": "Already admitted (same holder)",
            "links": links.HOLDING,
        },
        201: {"links": links.HOLDING},
        404: {"model": ErrorOut},
        409: {
            "model": ErrorOut,
            "description": "Does not fit, a GPU device is held, or holder conflict",
        },
    },
    # Named by the node, so a role may restrict callers to some nodes (resourceNames).
    dependencies=[require("create", "admissions", name=body("node"))],
)
async def admit(body: AdmissionIn, request: Request) -> Response:
    # The hot route, kept lean: async, with at most one worker-thread hop (in admit_async);
    # the service taken from the request, not from a dependency to solve; the answer
    # serialized here as FastAPI would (response_model documents it), not validated again.
    admissions: Admissions = request.app.state.services.admissions
    admission = await admissions.admit_async(
        AdmissionRequest(
            body.node,
            body.holder.holder(),
            body.requests.resources(),
            path="rest",
            devices=body.held_devices(),
        )
    )
    return Response(
        _HOLDING_JSON.dump_json(HoldingOut.of(admission.holding), by_alias=True),
        status_code=201 if admission.created else 200,
        media_type="application/json",
    )


@router.delete(
    "/admissions/{holder_uid}",
    responses={
        200: {"links": links.RELEASED},
        404: {"model": ErrorOut},
        409: {"model": ErrorOut, "description": "Held both as a pod and manually: give kind"},
    },
    dependencies=[require("delete", "admissions", name=path("holder_uid"))],
)
async def release(
    holder_uid: Annotated[str, Path(min_length=1, max_length=253, pattern=HOLDER_ID_PATTERN)],
    admissions: AdmissionsDep,
    # slurm_job holdings are the Slurm sync's alone: not a kind a caller may release.
    kind: Annotated[
        Literal["pod", "manual"] | None, Query(description="pod or manual; default either")
    ] = None,
) -> HoldingOut:
    holder_kind = HolderKind(kind) if kind is not None else None
    release = ReleaseRequest(holder_uid, holder_kind, path="rest")
    return HoldingOut.of(await admissions.release_async(release))
