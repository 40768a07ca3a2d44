"""GET /models, GET /models/{name}, and the admin POST/DELETE."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from service.api.auth import require_admin
from service.api.bodies import read_json, validate
from service.api.deps import ModelName, PlaneDep
from service.api.openapi import error_responses, json_body
from service.schemas.models import LoadModelRequest, ModelDetail, ModelInfo, ModelList

router = APIRouter(tags=["models"])


@router.get("/models", response_model=ModelList, summary="Every registered model")
async def list_models(plane: PlaneDep) -> ModelList:
    return ModelList(models=plane.models())


@router.get(
    "/models/{name}",
    response_model=ModelDetail,
    summary="One model's INFO with its repr",
    responses=error_responses(404),
)
async def get_model(name: ModelName, plane: PlaneDep) -> ModelDetail:
    return plane.model(name)


@router.post(
    "/models",
    status_code=202,
    response_model=ModelInfo,
    summary="Load a model at run time (admin)",
    dependencies=[Depends(require_admin)],
    responses=error_responses(400, 401, 403, 409, 422),
    openapi_extra=json_body(LoadModelRequest),
)
async def load_model(request: Request, plane: PlaneDep) -> JSONResponse:
    """The body is read only after the token is checked: nobody learns anything without it."""
    spec = validate(LoadModelRequest, await read_json(request))
    return JSONResponse(plane.add_model(spec).model_dump(mode="json"), status_code=202)


@router.delete(
    "/models/{name}",
    response_model=ModelInfo,
    summary="Unload a model and release its memory (admin)",
    dependencies=[Depends(require_admin)],
    responses=error_responses(401, 403, 404),
)
async def unload_model(name: ModelName, plane: PlaneDep) -> ModelInfo:
    return await plane.remove_model(name)
