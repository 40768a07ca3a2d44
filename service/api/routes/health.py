"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from service.api.deps import StateDep
from service.schemas.models import Health

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, summary="200 while the process serves")
async def healthz() -> Health:
    return Health(status="ok")


@router.get(
    "/readyz",
    response_model=Health,
    summary="200 once every configured model is ready",
    responses={503: {"model": Health, "description": "Some models are loading or failed."}},
)
async def readyz(state: StateDep) -> JSONResponse:
    not_ready = state.plane.unready_models()
    if not_ready or state.draining:
        status = "draining" if state.draining else "not ready"
        return JSONResponse({"status": status, "models": not_ready}, status_code=503)
    return JSONResponse({"status": "ready", "models": {}})
