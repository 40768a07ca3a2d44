"""TorchServe's inference API on hookserve's HTTP port: `/ping`, `/predictions/{model}[/{version}]` and
`/explanations/{model}[/{version}]`.

The image arrives as the raw body (`curl -T kitten.jpg` sends it with PUT, TorchServe's own
examples with POST) or as a multipart field `data`, `file` or `body`; `/explanations` also reads a
`target` field. Answers are shaped as TorchServe's stock `image_classifier` handler shapes them.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request, Response
from starlette.datastructures import UploadFile

from service.api.deps import PlaneDep
from service.codecs.torchserve import classifier_answer, error_body, explanation_answer, indented
from service.errors import BadInput, InvalidField
from service.schemas.torchserve import TorchServeError, TorchServeStatus
from service.torchserve.errors import TorchServeRoute

router = APIRouter(tags=["torchserve"], route_class=TorchServeRoute)
PATHS = ("/predictions", "/explanations")
IMAGE_FIELDS = ("data", "file", "body")
JSON = "application/json"

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": TorchServeError} for code in (400, 404, 409, 413, 422, 499, 503, 504)
}
ModelName = Annotated[str, Path(description="A served model (GET /models lists them).", examples=["resnet18"])]
Version = Annotated[str, Path(description="The archive's modelVersion (1 for other models).", examples=["1.0"])]
_IMAGE_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "properties": {"data": {"type": "string", "format": "binary"}, "target": {"type": "integer"}},
                }
            },
        },
    }
}


def error_bytes(detail: str, status: int) -> bytes:
    """The envelope of an error answered before a route runs (the body limit, shutdown)."""
    return error_body(status, detail)


async def read_image(request: Request) -> tuple[bytes, int | None]:
    """The image (raw body, or multipart `data` / `file` / `body`) and the multipart `target`, if any."""
    if request.headers.get("content-type", "").startswith("multipart/form-data"):
        async with request.form(max_files=4, max_fields=16) as form:
            image = next((form[k] for k in IMAGE_FIELDS if k in form), None)
            data = await image.read() if isinstance(image, UploadFile) else (image or "").encode()
            target = form.get("target")
            if isinstance(target, UploadFile):
                raise InvalidField("target must be a class index, not a file")
        if not data:
            raise BadInput(f"no image: send it as the body, or as a multipart field {', '.join(IMAGE_FIELDS)}")
        return data, _target(target)
    data = await request.body()
    if not data:
        raise BadInput("no image: send it as the body (curl -T image.jpg ...) or as a multipart field data")
    return data, _target(request.query_params.get("target"))


def _target(value: str | None) -> int | None:
    if value is None or value == "":
        return None
    if not value.strip().isdigit():
        raise InvalidField(f"target {value!r} must be a class index")
    return int(value)


@router.get(
    "/ping",
    summary="TorchServe's health check: Healthy once every model is ready",
    response_model=TorchServeStatus,
    responses={500: {"model": TorchServeStatus, "description": "Unhealthy: a model is loading or failed."}},
)
async def ping(plane: PlaneDep) -> Response:
    if plane.ts_healthy():
        return Response(indented({"status": "Healthy"}), media_type=JSON)
    return Response(indented({"status": "Unhealthy"}), status_code=500, media_type=JSON)


async def _predict(name: str, version: str | None, request: Request, plane: PlaneDep) -> Response:
    image, _ = await read_image(request)
    found = await plane.ts_predict(name, version, image)
    return Response(indented(classifier_answer(found.predictions[0]["top_k"])), media_type=JSON)


async def _explain(name: str, version: str | None, request: Request, plane: PlaneDep) -> Response:
    image, target = await read_image(request)
    attribution = await plane.ts_explain(name, version, image, target)
    body = await asyncio.to_thread(lambda: indented(explanation_answer(attribution.numpy())))
    return Response(body, media_type=JSON)


_PREDICT = "Top-5 classes of one image as {label: probability} (TorchServe's image_classifier)"
_EXPLAIN = "Integrated Gradients (15 steps, class `target`, default 0) over one image, as nested lists [C][H][W]"


async def predictions(name: ModelName, request: Request, plane: PlaneDep) -> Response:
    return await _predict(name, None, request, plane)


async def version_predictions(name: ModelName, version: Version, request: Request, plane: PlaneDep) -> Response:
    return await _predict(name, version, request, plane)


async def explanations(name: ModelName, request: Request, plane: PlaneDep) -> Response:
    return await _explain(name, None, request, plane)


async def version_explanations(name: ModelName, version: Version, request: Request, plane: PlaneDep) -> Response:
    return await _explain(name, version, request, plane)


for _path, _endpoint, _summary in (
    ("/predictions/{name}", predictions, _PREDICT),
    ("/predictions/{name}/{version}", version_predictions, _PREDICT),
    ("/explanations/{name}", explanations, _EXPLAIN),
    ("/explanations/{name}/{version}", version_explanations, _EXPLAIN),
):
    for _method in ("POST", "PUT"):  # curl -T sends PUT; TorchServe takes both
        router.add_api_route(
            _path,
            _endpoint,
            methods=[_method],
            summary=_summary,
            openapi_extra=_IMAGE_BODY,
            responses=ERRORS,
            operation_id=f"torchserve_{_endpoint.__name__}_{_method.lower()}",
        )
