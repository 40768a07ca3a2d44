"""TorchServe's management API, as an app of its own on `torchserve_management_port` (TorchServe's is 8081).

    GET    /models[?limit=&next_page_token=]         list
    GET    /models/{name}[/{version}|/all]           describe
    POST   /models?url=resnet18.mar&...              register an archive under the model dir (admin)
    PUT    /models/{name}[/{version}]?min_worker=N   scale: answered with what runs; nothing changes (admin)
    DELETE /models/{name}[/{version}]                unregister (admin)

Registering, scaling and unregistering need hookserve's admin token (`Authorization: Bearer ...`), as
POST /models does: an eager archive's model file is Python that runs when the model is built.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Query, Request, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from service import __version__
from service.codecs.torchserve import indented
from service.dataplane.admin import check_admin
from service.dataplane.plane import DataPlane
from service.dataplane.torchserve import Description
from service.errors import HookserveError, InvalidField
from service.torchserve.errors import TorchServeRoute, error_response

JSON = "application/json"
ALL_VERSIONS = "all"


def _json(content: Any, status: int = 200) -> Response:
    return Response(indented(content), status_code=status, media_type=JSON)


def _describe(found: Description) -> dict[str, Any]:
    return {
        "modelName": found.name,
        "modelVersion": found.version,
        "modelUrl": found.url,
        "runtime": "python",
        "minWorkers": len(found.workers),
        "maxWorkers": len(found.workers),
        "batchSize": found.batch_size,
        "maxBatchDelay": found.max_batch_delay_ms,
        "loadedAtStartup": False,
        "workers": [
            {
                "id": w.id,
                "startTime": w.start_time,
                "status": w.status,
                "memoryUsage": 0,
                "pid": w.pid,
                "gpu": w.gpu,
                "gpuUsage": "N/A",
            }
            for w in found.workers
        ],
        "jobQueueStatus": {"remainingCapacity": found.remaining, "pendingRequests": found.pending},
    }


def _flag(value: str | None, name: str, default: bool) -> bool:
    if value is None:
        return default
    if value.lower() not in ("true", "false"):
        raise InvalidField(f"{name} must be true or false")
    return value.lower() == "true"


def plane_of(request: Request) -> DataPlane:
    found: DataPlane = request.app.state.plane()
    return found


Plane = Annotated[DataPlane, Depends(plane_of)]


def admin(request: Request, found: Plane) -> None:
    check_admin(request.headers.get("authorization"), found.settings.admin_token)


def management_app(plane: Callable[[], DataPlane]) -> FastAPI:
    """The management API over the data plane `plane()` returns (the main app's, once its lifespan runs)."""
    router = APIRouter(route_class=TorchServeRoute)

    @router.get("/models", summary="Every model: name and where it came from")
    async def list_models(
        found: Plane, limit: Annotated[int, Query(ge=1, le=1000)] = 100, next_page_token: int = 0
    ) -> Response:
        models = found.ts_models()
        page = models[next_page_token : next_page_token + limit]
        answer: dict[str, Any] = {"models": [{"modelName": name, "modelUrl": url} for name, url in page]}
        if next_page_token + limit < len(models):
            answer["nextPageToken"] = str(next_page_token + limit)
        return _json(answer)

    @router.get("/models/{name}", summary="Describe a model: its workers, batching and queue")
    async def describe(name: str, found: Plane) -> Response:
        return _json([_describe(found.ts_describe(name, None))])

    @router.get("/models/{name}/{version}", summary="Describe one version (or all)")
    async def describe_version(name: str, version: str, found: Plane) -> Response:
        return _json([_describe(found.ts_describe(name, None if version == ALL_VERSIONS else version))])

    @router.post("/models", summary="Register a .mar archive from the model dir (admin)", dependencies=[Depends(admin)])
    async def register(
        found: Plane,
        *,
        url: str,
        model_name: str | None = None,
        batch_size: Annotated[int | None, Query(ge=1)] = None,
        max_batch_delay: Annotated[int | None, Query(ge=0)] = None,
        initial_workers: Annotated[int | None, Query(ge=0)] = None,
        synchronous: str | None = None,
        response_timeout: int | None = None,
        startup_timeout: int | None = None,
        handler: str | None = None,
        runtime: str | None = None,
    ) -> Response:
        settings = found.settings
        ignored: dict[str, str] = {}
        threads = f"hookserve runs every model on {settings.worker_threads} executor threads (HOOKSERVE_WORKER_THREADS)"
        if initial_workers is not None and initial_workers != settings.worker_threads:
            ignored["initial_workers"] = threads
        if response_timeout is not None:
            ignored["response_timeout"] = (
                f"request deadlines are server-wide: HOOKSERVE_REQUEST_TIMEOUT_S ({settings.request_timeout_s:g} s)"
            )
        if startup_timeout is not None:
            ignored["startup_timeout"] = (
                f"load deadlines are server-wide: HOOKSERVE_LOAD_TIMEOUT_S ({settings.load_timeout_s:g} s)"
            )
        if handler is not None:
            ignored["handler"] = "the archive's own handler is used (image_classifier is the one served)"
        if runtime is not None and runtime != "python":
            ignored["runtime"] = "models run in hookserve's own process"
        done = await found.ts_register(
            url=url,
            name=model_name,
            batch_size=batch_size,
            max_batch_delay_ms=max_batch_delay,
            ignored=ignored,
            synchronous=_flag(synchronous, "synchronous", False),
        )
        answer: dict[str, Any] = {"status": done.status}
        if done.not_mapped:
            answer["notMapped"] = done.not_mapped
        return _json(answer, 200 if done.ready else 202)

    async def scale(
        name: str, version: str | None, found: DataPlane, min_worker: int | None, max_worker: int | None
    ) -> Response:
        return _json({"status": found.ts_scale(name, version, min_worker, max_worker)})

    @router.put("/models/{name}", summary="Scale workers: says what runs (admin)", dependencies=[Depends(admin)])
    async def scale_model(
        name: str, found: Plane, *, min_worker: int | None = None, max_worker: int | None = None
    ) -> Response:
        return await scale(name, None, found, min_worker, max_worker)

    @router.put(
        "/models/{name}/{version}", summary="Scale one version's workers (admin)", dependencies=[Depends(admin)]
    )
    async def scale_version(
        name: str, version: str, found: Plane, *, min_worker: int | None = None, max_worker: int | None = None
    ) -> Response:
        return await scale(name, version, found, min_worker, max_worker)

    @router.delete("/models/{name}", summary="Unregister a model (admin)", dependencies=[Depends(admin)])
    async def unregister(name: str, found: Plane) -> Response:
        return _json({"status": await found.ts_unregister(name, None)})

    @router.delete("/models/{name}/{version}", summary="Unregister one version (admin)", dependencies=[Depends(admin)])
    async def unregister_version(name: str, version: str, found: Plane) -> Response:
        return _json({"status": await found.ts_unregister(name, version)})

    app = FastAPI(title="hookserve: TorchServe-compatible management API", version=__version__)
    app.state.plane = plane
    app.include_router(router)

    @app.exception_handler(StarletteHTTPException)
    async def _not_here(request: Request, exc: StarletteHTTPException) -> Response:
        return error_response(exc.status_code, exc.detail, exc.headers)

    @app.exception_handler(HookserveError)
    async def _domain(request: Request, exc: HookserveError) -> Response:
        return error_response(exc.status, exc.detail, exc.headers)

    return app
