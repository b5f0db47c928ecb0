"""Hints from slurmctld (slurm-plugins/hooks/nodeledger-job-hint): "these jobs changed", and
from its node_features plugin "these nodes changed state"."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field, StrictInt

from app.api.schemas import ErrorOut
from app.auth.guard import require
from app.core.errors import NodeledgerError
from app.slurm.hint_queue import HintQueue

router = APIRouter(prefix="/v1/slurm", tags=["slurm"])

MAX_JOB_ID = 2**32 - 1  # Slurm job ids are uint32
MAX_PER_REQUEST = 1000
# A Slurm node name (no hostlist expression), or "*": every node (hint_queue.EVERY_NODE).
NODE_NAME = r"^([A-Za-z0-9._-]{1,256}|\*)$"


class SlurmDisabled(NodeledgerError):
    """Job hints for a service that runs without the Slurm integration."""

    code = "slurm_disabled"
    http_status = 409


SLURM_OFF: dict[int | str, dict[str, Any]] = {
    409: {"model": ErrorOut, "description": "The Slurm integration is off"}
}
HINTS = {
    **SLURM_OFF,
    429: {
        "model": ErrorOut,
        "description": "Too many hints a second: a full listing covers this one (Retry-After)",
    },
}


def _queue(request: Request) -> HintQueue:
    """Where hints go; SlurmDisabled when the Slurm integration is off."""
    hints: HintQueue | None = request.app.state.services.job_hints
    if hints is None:
        raise SlurmDisabled("the Slurm integration is off (NODELEDGER_SLURM_ENABLED)")
    return hints


class JobHintsIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    job_ids: list[Annotated[StrictInt, Field(ge=1, le=MAX_JOB_ID)]] = Field(
        min_length=1,
        max_length=MAX_PER_REQUEST,
        description="Slurm job ids that started, ended or were requeued (1 to 4294967295)",
    )


class JobHintsOut(BaseModel):
    accepted: int = Field(description="Distinct job ids queued for the Slurm sync")


@router.post(
    "/job-hints",
    status_code=202,
    response_model=JobHintsOut,
    responses=HINTS,
    dependencies=[require("create", "jobhints")],
)
async def post_job_hints(body: JobHintsIn, request: Request) -> JobHintsOut:
    """Queue the jobs for the Slurm sync, which reads each from Slurm; answers at once."""
    await run_in_threadpool(_queue(request).post, body.job_ids)
    return JobHintsOut(accepted=len(set(body.job_ids)))


class NodeHintsIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    nodes: list[Annotated[str, Field(pattern=NODE_NAME)]] = Field(
        max_length=MAX_PER_REQUEST,
        description='Slurm nodes whose state changed (drained, resumed, DOWN, FAIL, ...); "*": '
        "every node may have (more changed at once than a request names); none: the "
        "plugin's heartbeat (its watcher runs, nothing changed)",
    )


class NodeHintsOut(BaseModel):
    accepted: int = Field(description="Distinct nodes queued for the Slurm sync")


@router.post(
    "/node-hints",
    status_code=202,
    response_model=NodeHintsOut,
    responses=HINTS,
    dependencies=[require("create", "jobhints")],  # the same hook, the same token
)
async def post_node_hints(body: NodeHintsIn, request: Request) -> NodeHintsOut:
    """Queue the nodes for the Slurm sync, which reads each from Slurm; answers at once."""
    await run_in_threadpool(_queue(request).post_nodes, body.nodes)
    return NodeHintsOut(accepted=len(set(body.nodes)))
