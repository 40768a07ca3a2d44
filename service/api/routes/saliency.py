"""POST /saliency: attribution maps, one registered method per request (`method` picks its parameters)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request, Response
from starlette.concurrency import run_in_threadpool

from service.api.bodies import parse_body
from service.api.deps import PlaneDep
from service.api.observability import set_request_model
from service.api.openapi import BINARY_OR_PNG, error_responses, union_body_with_multipart
from service.api.responses import file_response, json_response, png_response
from service.codecs.pictures import saliency_png
from service.codecs.tensors import json_tensor
from service.config import Settings
from service.dataplane.attribution import Saliency
from service.introspection.attribution import SaliencyItem, registered_methods
from service.introspection.attribution.requests import choose_request, request_class
from service.schemas.attribution import SaliencyCommon, SaliencyResponse
from service.schemas.examples import SAMPLE_INPUTS
from service.specs.vocab import SaliencyFormat

router = APIRouter(tags=["introspection"])

METHODS = ", ".join(registered_methods())


@router.post(
    "/saliency",
    response_model=SaliencyResponse,
    summary=f"Attribution maps (Captum) by method: {METHODS}",
    openapi_extra=union_body_with_multipart(
        "SaliencyRequest",
        [request_class(m) for m in registered_methods()],
        "The attribution method (Captum's).",
        {"model": "lenet", "inputs": SAMPLE_INPUTS, "method": "gradcam", "format": "png"},
    ),
    responses={**error_responses(400, 404, 409, 413, 422, 503), **BINARY_OR_PNG},
)
async def saliency(request: Request, plane: PlaneDep) -> Response:
    parsed = await parse_body(request, choose_request, plane.settings)
    set_request_model(request, parsed.body.model)
    result = await plane.saliency(parsed.body, parsed.images)
    return await _answer(result, parsed.body, plane.settings)


async def _answer(result: Saliency, body: SaliencyCommon, settings: Settings) -> Response:
    model, items = result.model, result.items
    if body.format is SaliencyFormat.png:
        heatmaps = [item.heatmap for item in items]
        png = await run_in_threadpool(saliency_png, list(result.inputs), heatmaps, model.preprocess, body.alpha)
        return png_response(png, f"saliency-{result.method}")
    head = {"model": model.name, "method": result.method}
    if body.format is not SaliencyFormat.json:
        tensors = {
            f"{i}:{part}": getattr(item, part) for i, item in enumerate(items) for part in ("attribution", "heatmap")
        }
        rest = head | {"results": [_result(item, model.label(item.target), None) for item in items]}
        return await file_response(body.format.value, tensors, rest, settings, f"saliency-{result.method}")
    numel = sum(item.attribution.numel() + item.heatmap.numel() for item in items)
    content = head | {"results": [_result(item, model.label(item.target), json_tensor) for item in items]}
    return await json_response(content, settings, numel=numel)


def _result(item: SaliencyItem, label: str, encode: Callable[[Any], Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {"target": item.target, "label": label, "score": item.score, "probability": item.probability}
    if encode is not None:
        out |= {"attribution": encode(item.attribution), "heatmap": encode(item.heatmap)}
    if item.convergence_delta is not None:
        out["convergence_delta"] = item.convergence_delta
    if item.tokens is not None:
        out["tokens"] = item.tokens.describe()
    return out
