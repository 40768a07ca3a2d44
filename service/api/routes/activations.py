"""POST /activations: inputs/outputs of named layers, captured by hooks that live for this request only."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from starlette.concurrency import run_in_threadpool

from service.api.bodies import parse_body
from service.api.deps import PlaneDep
from service.api.observability import set_request_model
from service.api.openapi import body_with_multipart, error_responses
from service.api.responses import file_response, json_response, png_response
from service.codecs.formats import OCTET
from service.codecs.pictures import activation_grid_png
from service.codecs.tensors import json_tensor
from service.config import Settings
from service.dataplane.inspection import Activations
from service.dtypes import dtype_name
from service.introspection.capture import captured_outputs, captured_tensors
from service.introspection.tensor_stats import captured_stats
from service.schemas.activations import ActivationsRequest, ActivationsResponse
from service.specs.vocab import ActivationFormat

router = APIRouter(tags=["introspection"])


@router.post(
    "/activations",
    response_model=ActivationsResponse,
    summary="Inputs/outputs of named layers for these inputs (JSON, stats, safetensors, npz or a PNG grid)",
    openapi_extra=body_with_multipart(ActivationsRequest),
    responses={
        **error_responses(400, 404, 409, 413, 422, 503),
        200: {"content": {OCTET: {}, "image/png": {}}, "description": "JSON, a binary file, or a PNG."},
    },
)
async def activations(request: Request, plane: PlaneDep) -> Response:
    parsed = await parse_body(request, ActivationsRequest, plane.settings)
    set_request_model(request, parsed.body.model)
    result = await plane.activations(parsed.body, parsed.images)
    return await _answer(result, parsed.body, plane.settings)


async def _answer(result: Activations, body: ActivationsRequest, settings: Settings) -> Response:
    captured = result.captured
    head = {"model": result.model, "predictions": result.predictions}
    fmt = body.format
    if fmt is ActivationFormat.png:
        png = await run_in_threadpool(activation_grid_png, captured_outputs(captured), body.png_layer, body.channels)
        return png_response(png, "activations")
    if fmt is ActivationFormat.stats:
        return await json_response(head | {"activations": await run_in_threadpool(captured_stats, captured)}, settings)
    if fmt is not ActivationFormat.json:
        rest = head | {"activations": _shapes(result)}
        return await file_response(fmt.value, captured_tensors(captured), rest, settings, "activations")
    numel = sum(t.numel() for sides in captured.values() for t in sides.values())
    content = head | {"activations": {k: {s: json_tensor(t) for s, t in v.items()} for k, v in captured.items()}}
    return await json_response(content, settings, numel=numel)


def _shapes(result: Activations) -> dict[str, dict[str, Any]]:
    return {
        key: {side: {"shape": list(t.shape), "dtype": dtype_name(t.dtype)} for side, t in sides.items()}
        for key, sides in result.captured.items()
    }
