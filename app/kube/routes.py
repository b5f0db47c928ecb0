"""kube-scheduler extender endpoints (filter, prioritize, bind)."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter(prefix="/v1/extender", tags=["kube-scheduler extender"])
