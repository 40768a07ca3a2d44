"""KServe / Triton Open Inference Protocol (REST, binary tensor extension) under /v2, for `tritonclient.http`."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, TypeVar

import orjson
from fastapi import APIRouter, Depends, Path, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from service import __version__
from service.api.auth import require_admin
from service.api.openapi import register_schema
from service.api.state import StateDep
from service.codecs.oip import HEADER_LENGTH
from service.errors import BadInput, InvalidField, NotFound
from service.runtime import oip_repository
from service.runtime.fleet import Status
from service.runtime.oip import PLATFORM, infer, input_info, output_info
from service.runtime.oip_request import decode_body, encode_infer
from service.schemas.v2 import (
    ErrorV2,
    InferRequest,
    InferResponse,
    Live,
    ModelMetadata,
    ModelReady,
    Ready,
    RepositoryIndexRequest,
    RepositoryLoadRequest,
    RepositoryModel,
    RepositoryUnloadRequest,
    ServerMetadata,
    TensorMetadata,
)

router = APIRouter(prefix="/v2", tags=["open inference protocol"])

M = TypeVar("M", bound=BaseModel)
EXTENSIONS = ["binary_tensor_data", "classification", "model_repository"]
VERSIONS = ["1"]
OCTET = "application/octet-stream"

ModelName = Annotated[str, Path(description="A model name from POST /v2/repository/index.", examples=["lenet"])]
Version = Annotated[str, Path(description='The only version is "1".', examples=["1"])]

for _cls in (InferRequest, RepositoryIndexRequest, RepositoryLoadRequest, RepositoryUnloadRequest):
    register_schema(_cls)


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {code: {"model": ErrorV2} for code in codes}


def _json_body(cls: type[M]) -> dict[str, Any]:
    return {
        "requestBody": {"content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{cls.__name__}"}}}}
    }


def _check_version(name: str, version: str | None) -> None:
    if version is not None and version not in VERSIONS:
        raise NotFound(f"model {name!r} has no version {version!r}; its versions are {VERSIONS}")


def _not_ready(message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=400)


async def _read_json(request: Request, cls: type[M]) -> M:
    """A small JSON body; empty means defaults (tritonclient sends none, and no Content-Type)."""
    raw = await request.body()
    try:
        data = orjson.loads(raw) if raw.strip() else {}
    except orjson.JSONDecodeError:
        raise BadInput("body is not valid JSON") from None
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise InvalidField("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())) from None


@router.get("", response_model=ServerMetadata, summary="Server metadata")
async def server_metadata() -> ServerMetadata:
    return ServerMetadata(name="hookserve", version=__version__, extensions=EXTENSIONS)


@router.get("/health/live", response_model=Live, summary="200 while the server answers")
async def server_live() -> Live:
    return Live(live=True)


@router.get(
    "/health/ready",
    response_model=Ready,
    summary="200 once every registered model is ready, else 400",
    responses=_errors(400),
)
async def server_ready(state: StateDep) -> Any:
    if state.draining:
        return _not_ready("server is shutting down")
    waiting = [f"{e.spec.name} ({e.status})" for e in state.fleet.entries() if e.status is not Status.ready]
    if waiting:
        return _not_ready(f"models not ready: {', '.join(waiting)}")
    return Ready(ready=True)


async def _model_metadata(name: str, version: str | None, state: StateDep) -> ModelMetadata:
    _check_version(name, version)
    model, executor = state.fleet.ready(name)
    tensors = [input_info(model), *await output_info(model, executor)]
    meta = [TensorMetadata(name=t.name, datatype=t.datatype, shape=t.shape) for t in tensors]
    return ModelMetadata(name=name, versions=VERSIONS, platform=PLATFORM, inputs=meta[:1], outputs=meta[1:])


@router.get(
    "/models/{name}",
    response_model=ModelMetadata,
    summary="Model metadata: input__0 and output__0.. with datatypes and shapes",
    responses=_errors(404, 409),
)
async def model_metadata(name: ModelName, state: StateDep) -> ModelMetadata:
    return await _model_metadata(name, None, state)


@router.get(
    "/models/{name}/versions/{version}",
    response_model=ModelMetadata,
    summary="Model metadata of one version",
    responses=_errors(404, 409),
)
async def model_version_metadata(name: ModelName, version: Version, state: StateDep) -> ModelMetadata:
    return await _model_metadata(name, version, state)


async def _model_ready(name: str, version: str | None, state: StateDep) -> Any:
    _check_version(name, version)
    entry = state.fleet.entry(name)
    if entry.status is not Status.ready:
        return _not_ready(f"model {name!r} is {entry.status}" + (f": {entry.error}" if entry.error else ""))
    return ModelReady(name=name, ready=True)


@router.get(
    "/models/{name}/ready",
    response_model=ModelReady,
    summary="200 when the model is ready, else 400",
    responses=_errors(400, 404),
)
async def model_ready(name: ModelName, state: StateDep) -> Any:
    return await _model_ready(name, None, state)


@router.get(
    "/models/{name}/versions/{version}/ready",
    response_model=ModelReady,
    summary="Readiness of one version",
    responses=_errors(400, 404),
)
async def model_version_ready(name: ModelName, version: Version, state: StateDep) -> Any:
    return await _model_ready(name, version, state)


_INFER_DOC: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/InferRequest"}},
            OCTET: {
                "schema": {"type": "string", "format": "binary"},
                "description": f"Binary tensor extension: the JSON header, then the raw tensor bytes; "
                f"`{HEADER_LENGTH}` gives the JSON's length. gzip/deflate `Content-Encoding` is accepted.",
            },
        },
    }
}
_INFER_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "content": {OCTET: {"schema": {"type": "string", "format": "binary"}}},
        "description": f"JSON; with binary outputs, the JSON header (`{HEADER_LENGTH}` bytes) then their bytes.",
    },
    **_errors(400, 404, 409, 413, 422, 503),
}


async def _infer(name: str, version: str | None, request: Request, state: StateDep) -> Response:
    _check_version(name, version)
    model, executor = state.fleet.ready(name)
    body = await request.body()
    loop = asyncio.get_running_loop()
    decoded = await loop.run_in_executor(
        state.decode_pool,
        decode_body,
        body,
        request.headers.get("content-encoding"),
        request.headers.get(HEADER_LENGTH),
        model,
        state.settings,
    )
    names = None if decoded.outputs is None else [o.name for o in decoded.outputs]
    tensors = await infer(model, executor, decoded.batch, names)
    if sum(t.numel() for t in tensors.values()) > 4096:
        content, header_length = await loop.run_in_executor(
            state.decode_pool, encode_infer, model, decoded, tensors, state.settings
        )
    else:
        content, header_length = encode_infer(model, decoded, tensors, state.settings)
    if header_length is None:
        return Response(content, media_type="application/json")
    return Response(content, media_type=OCTET, headers={HEADER_LENGTH: str(header_length)})


@router.post(
    "/models/{name}/infer",
    response_model=InferResponse,
    summary="Inference; outputs may name any layer (our extension)",
    openapi_extra=_INFER_DOC,
    responses=_INFER_RESPONSES,
)
async def model_infer(name: ModelName, request: Request, state: StateDep) -> Response:
    return await _infer(name, None, request, state)


@router.post(
    "/models/{name}/versions/{version}/infer",
    response_model=InferResponse,
    summary="Inference on one version",
    openapi_extra=_INFER_DOC,
    responses=_INFER_RESPONSES,
)
async def model_version_infer(name: ModelName, version: Version, request: Request, state: StateDep) -> Response:
    return await _infer(name, version, request, state)


@router.post(
    "/repository/index",
    response_model=list[RepositoryModel],
    summary="Every model with its state (READY, LOADING, UNAVAILABLE) and reason",
    openapi_extra=_json_body(RepositoryIndexRequest),
    responses=_errors(400, 422),
)
async def repository_index(request: Request, state: StateDep) -> list[dict[str, Any]]:
    body = await _read_json(request, RepositoryIndexRequest)
    return oip_repository.repository_index(state.fleet, ready_only=body.ready)


@router.post(
    "/repository/models/{name}/load",
    summary="Load a model (again) and wait until it is ready (admin)",
    dependencies=[Depends(require_admin)],
    openapi_extra=_json_body(RepositoryLoadRequest),
    responses=_errors(401, 403, 404, 409, 422),
)
async def repository_load(name: ModelName, request: Request, state: StateDep) -> JSONResponse:
    body = await _read_json(request, RepositoryLoadRequest)
    params = body.parameters or {}
    if any(key.startswith("file:") for key in params):
        raise InvalidField("model files in the request are not supported; give parameters.config (a model spec)")
    config = params.get("config")
    if config is not None and not isinstance(config, str):
        raise InvalidField("parameters.config must be a string holding a JSON model spec")
    await oip_repository.load(state.fleet, name, config)
    return JSONResponse({})


@router.post(
    "/repository/models/{name}/unload",
    summary="Unload a model and release its memory; a later load brings it back (admin)",
    dependencies=[Depends(require_admin)],
    openapi_extra=_json_body(RepositoryUnloadRequest),
    responses=_errors(401, 403, 404, 422),
)
async def repository_unload(name: ModelName, request: Request, state: StateDep) -> JSONResponse:
    await _read_json(request, RepositoryUnloadRequest)
    await oip_repository.unload(state.fleet, name)
    return JSONResponse({})
