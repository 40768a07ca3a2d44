"""KServe / Triton Open Inference Protocol (REST, binary tensor extension) under /v2, for `tritonclient.http`.

This router is self-contained, as a sub-application: its routes answer every error in the
protocol's envelope `{"error": "<text>"}` (see `OipRoute`), unknown /v2 paths included, and
each handler serves both the unversioned and the `/versions/{version}` path of a pair.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Annotated, Any, TypeVar

import orjson
from fastapi import APIRouter, Depends, Path, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Match

from service import __version__
from service.api.auth import require_admin
from service.api.deps import PlaneDep, StateDep
from service.api.errors import as_text, clean_validation_errors
from service.api.openapi import register_schema
from service.codecs.oip import HEADER_LENGTH
from service.codecs.oip_codec import HttpInfer
from service.codecs.triton_extensions import as_json, config_message, statistics_message
from service.dataplane.oip import EXTENSIONS, PLATFORM, VERSIONS
from service.dataplane.triton_extensions import NamedStatistics
from service.errors import BadInput, HookserveError, InvalidField, NotFound
from service.schemas.v2 import (
    ErrorV2,
    InferRequest,
    InferResponse,
    Live,
    ModelMetadata,
    ModelReady,
    ModelStatisticsAnswer,
    Ready,
    RepositoryIndexRequest,
    RepositoryLoadRequest,
    RepositoryModel,
    RepositoryUnloadRequest,
    ServerMetadata,
    TensorMetadata,
)

PREFIX = "/v2"
OCTET = "application/octet-stream"
log = logging.getLogger("hookserve.api")

M = TypeVar("M", bound=BaseModel)
Handler = Callable[..., Awaitable[Any]]


def oip_error(status: int, detail: Any, headers: Mapping[str, str] | None = None) -> JSONResponse:
    """The protocol's error envelope."""
    return JSONResponse({"error": as_text(detail)}, status_code=status, headers=headers)


def oip_error_body(detail: str, status: int = 500) -> bytes:
    """The envelope's bytes, for answers given outside the router (the body-size limit)."""
    return orjson.dumps({"error": detail})


class OipRoute(APIRoute):
    """A /v2 route: every error it raises, validation included, is answered in the protocol's envelope."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()

        async def envelope(request: Request) -> Response:
            try:
                return await handle(request)
            except HookserveError as exc:
                return oip_error(exc.status, exc.detail, exc.headers)
            except RequestValidationError as exc:
                return oip_error(422, clean_validation_errors(exc.errors()))
            except StarletteHTTPException as exc:
                return oip_error(exc.status_code, exc.detail, exc.headers)
            except ClientDisconnect:
                raise  # the app answers 499 to nobody
            except Exception as exc:
                log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
                return oip_error(500, "internal server error")

        return envelope


router = APIRouter(prefix=PREFIX, tags=["open inference protocol"], route_class=OipRoute)

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


def versioned(
    method: str, paths: tuple[str, str], names: tuple[str, str], summaries: tuple[str, str], **kwargs: Any
) -> Callable[[Handler], Handler]:
    """Serve an unversioned path and its `/versions/{version}` twin with one handler.

    The handler takes `version: str | None`; the unversioned route calls it with None and shows
    no version parameter, the versioned one shows `{version}` as a path parameter. `names` and
    `summaries` are the two routes' operation names and summaries.
    """

    def register(handler: Handler) -> Handler:
        signature = inspect.signature(handler)
        others = [p for p in signature.parameters.values() if p.name != "version"]
        in_path = inspect.Parameter("version", inspect.Parameter.KEYWORD_ONLY, annotation=Version)

        @functools.wraps(handler)
        async def unversioned(*args: Any, **kw: Any) -> Any:
            return await handler(*args, version=None, **kw)

        @functools.wraps(handler)
        async def with_version(*args: Any, **kw: Any) -> Any:
            return await handler(*args, **kw)

        unversioned.__signature__ = signature.replace(parameters=others)  # type: ignore[attr-defined]
        with_version.__signature__ = signature.replace(parameters=[*others, in_path])  # type: ignore[attr-defined]
        for path, endpoint, name, summary in zip(paths, (unversioned, with_version), names, summaries, strict=True):
            router.add_api_route(path, endpoint, methods=[method], name=name, summary=summary, **kwargs)
        return handler

    return register


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
    why = state.plane.not_ready()
    return _not_ready(why) if why else Ready(ready=True)


@router.get(
    "/models/stats",
    summary="Triton's statistics of every ready model",
    response_model=ModelStatisticsAnswer,
    responses=_errors(404),
)
async def all_model_statistics(plane: PlaneDep) -> dict[str, Any]:
    return _statistics_json(plane.model_statistics(None, None))


@versioned(
    "GET",
    ("/models/{name}", "/models/{name}/versions/{version}"),
    names=("model_metadata", "model_version_metadata"),
    summaries=("Model metadata: input__0 and output__0.. with datatypes and shapes", "Model metadata of one version"),
    response_model=ModelMetadata,
    responses=_errors(404, 409),
)
async def model_metadata(name: ModelName, plane: PlaneDep, version: str | None) -> ModelMetadata:
    found = await plane.model_metadata(name, version)
    tensors = [TensorMetadata(name=t.name, datatype=t.datatype, shape=t.shape) for t in (*found.inputs, *found.outputs)]
    n = len(found.inputs)
    return ModelMetadata(name=name, versions=VERSIONS, platform=PLATFORM, inputs=tensors[:n], outputs=tensors[n:])


@versioned(
    "GET",
    ("/models/{name}/ready", "/models/{name}/versions/{version}/ready"),
    names=("model_ready", "model_version_ready"),
    summaries=("200 when the model is ready, else 400", "Readiness of one version"),
    response_model=ModelReady,
    responses=_errors(400, 404),
)
async def model_ready(name: ModelName, plane: PlaneDep, version: str | None) -> Any:
    why = plane.model_not_ready(name, version)
    return _not_ready(why) if why else ModelReady(name=name, ready=True)


@versioned(
    "GET",
    ("/models/{name}/config", "/models/{name}/versions/{version}/config"),
    names=("model_config", "model_version_config"),
    summaries=(
        "Triton's model configuration: inputs, outputs, max batch size, dynamic batching, instances",
        "Model configuration of one version",
    ),
    response_model=dict[str, Any],
    responses=_errors(404, 409),
)
async def model_config(name: ModelName, plane: PlaneDep, version: str | None) -> dict[str, Any]:
    return as_json(config_message(await plane.model_config(name, version)))


@versioned(
    "GET",
    ("/models/{name}/stats", "/models/{name}/versions/{version}/stats"),
    names=("model_statistics", "model_version_statistics"),
    summaries=(
        "Triton's statistics: requests, queue and compute times, batches (every front counts)",
        "Statistics of one version",
    ),
    response_model=ModelStatisticsAnswer,
    responses=_errors(404, 409),
)
async def model_statistics(name: ModelName, plane: PlaneDep, version: str | None) -> dict[str, Any]:
    return _statistics_json(plane.model_statistics(name, version))


def _statistics_json(found: list[NamedStatistics]) -> dict[str, Any]:
    return as_json(statistics_message([(s.name, s.version, s.statistics) for s in found]))


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


@versioned(
    "POST",
    ("/models/{name}/infer", "/models/{name}/versions/{version}/infer"),
    names=("model_infer", "model_version_infer"),
    summaries=("Inference; outputs may name any layer (our extension)", "Inference on one version"),
    response_model=InferResponse,
    openapi_extra=_INFER_DOC,
    responses=_INFER_RESPONSES,
)
async def model_infer(name: ModelName, request: Request, plane: PlaneDep, version: str | None) -> Response:
    headers = request.headers
    codec = HttpInfer(request.body, headers.get("content-encoding"), headers.get(HEADER_LENGTH))
    answer = await plane.infer(name, version, codec)
    if answer.header_length is None:
        return Response(answer.body, media_type="application/json")
    return Response(answer.body, media_type=OCTET, headers={HEADER_LENGTH: str(answer.header_length)})


@router.post(
    "/repository/index",
    response_model=list[RepositoryModel],
    summary="Every model with its state (READY, LOADING, UNAVAILABLE) and reason",
    openapi_extra=_json_body(RepositoryIndexRequest),
    responses=_errors(400, 422),
)
async def repository_index(request: Request, plane: PlaneDep) -> list[dict[str, Any]]:
    body = await _read_json(request, RepositoryIndexRequest)
    return plane.repository_index(ready_only=body.ready)


@router.post(
    "/repository/models/{name}/load",
    summary="Load a model (again) and wait until it is ready (admin)",
    dependencies=[Depends(require_admin)],
    openapi_extra=_json_body(RepositoryLoadRequest),
    responses=_errors(401, 403, 404, 409, 422),
)
async def repository_load(name: ModelName, request: Request, plane: PlaneDep) -> JSONResponse:
    body = await _read_json(request, RepositoryLoadRequest)
    await plane.repository_load(name, body.parameters)
    return JSONResponse({})


@router.post(
    "/repository/models/{name}/unload",
    summary="Unload a model and release its memory; a later load brings it back (admin)",
    dependencies=[Depends(require_admin)],
    openapi_extra=_json_body(RepositoryUnloadRequest),
    responses=_errors(401, 403, 404, 422),
)
async def repository_unload(name: ModelName, request: Request, plane: PlaneDep) -> JSONResponse:
    await _read_json(request, RepositoryUnloadRequest)
    await plane.repository_unload(name)
    return JSONResponse({})


ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


@router.api_route("/{path:path}", methods=ALL_METHODS, include_in_schema=False)
async def unknown(request: Request) -> Response:
    """Any other /v2 path: 405 when another method serves it, else 404 (in the protocol's envelope)."""
    scope = {**request.scope, "method": "GET"}
    allowed = {
        method
        for route in router.routes
        if isinstance(route, APIRoute) and route.endpoint is not unknown
        for method in route.methods or ()
        if route.matches({**scope, "method": method})[0] is Match.FULL
    }
    if allowed:
        return oip_error(405, "Method Not Allowed", {"Allow": ", ".join(sorted(allowed))})
    raise NotFound("Not Found")
