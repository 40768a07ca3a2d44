"""GET /models, GET /models/{name}, and the admin POST/DELETE."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import JSONResponse

from service.api.auth import require_admin
from service.api.info import model_detail, model_info
from service.api.inputs import read_json, validate
from service.api.openapi import error_responses, json_body
from service.api.state import StateDep
from service.schemas.models import LoadModelRequest, ModelDetail, ModelInfo, ModelList

router = APIRouter(tags=["models"])

ModelName = Annotated[str, Path(description="A model name from GET /models.", examples=["lenet"])]


@router.get("/models", response_model=ModelList, summary="Every registered model")
async def list_models(state: StateDep) -> ModelList:
    return ModelList(models=[model_info(e) for e in state.fleet.entries()])


@router.get(
    "/models/{name}",
    response_model=ModelDetail,
    summary="One model's INFO with its repr",
    responses=error_responses(404),
)
async def get_model(name: ModelName, state: StateDep) -> ModelDetail:
    return model_detail(state.fleet.entry(name))


@router.post(
    "/models",
    status_code=202,
    response_model=ModelInfo,
    summary="Load a model at run time (admin)",
    dependencies=[Depends(require_admin)],
    responses=error_responses(400, 401, 403, 409, 422),
    openapi_extra=json_body(LoadModelRequest),
)
async def load_model(request: Request, state: StateDep) -> JSONResponse:
    """The body is read only after the token is checked: nobody learns anything without it."""
    spec = validate(LoadModelRequest, await read_json(request))
    entry = state.fleet.add(spec)
    return JSONResponse(model_info(entry).model_dump(mode="json"), status_code=202)


@router.delete(
    "/models/{name}",
    response_model=ModelInfo,
    summary="Unload a model and release its memory (admin)",
    dependencies=[Depends(require_admin)],
    responses=error_responses(401, 403, 404),
)
async def unload_model(name: ModelName, state: StateDep) -> ModelInfo:
    entry = state.fleet.entry(name)
    info = model_info(entry)
    await state.fleet.remove(name)
    return info
