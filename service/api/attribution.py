"""POST /gradients and POST /saliency: why the model said what it said."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from fastapi import APIRouter, Request, Response
from starlette.concurrency import run_in_threadpool

from service.api.openapi import body_with_multipart, error_responses
from service.api.responses import OCTET, binary_response, json_response, png_response
from service.api.running import prepare
from service.api.state import StateDep
from service.codecs.pictures import heatmap_grid_png, heatmap_overlay_png
from service.codecs.preprocess import denormalize
from service.codecs.tensors import json_tensor
from service.errors import InvalidField
from service.introspection.layers import resolve_layers
from service.introspection.saliency import SaliencyItem, SaliencyMethod
from service.introspection.targets import TargetSpec
from service.runtime.attribution_jobs import run_gradients, run_saliency
from service.schemas.attribution import GradientsRequest, GradientsResponse, SaliencyRequest, SaliencyResponse
from service.specs.model import PreprocessSpec
from service.specs.vocab import SaliencyFormat, TensorFormat

router = APIRouter(tags=["introspection"])

BINARY_OR_PNG: dict[int | str, dict[str, Any]] = {
    200: {"content": {OCTET: {}, "image/png": {}}, "description": "JSON, a binary file, or a PNG."}
}


@router.post(
    "/gradients",
    response_model=GradientsResponse,
    summary="d(target logit)/d(layer outputs) and d/d(input)",
    openapi_extra=body_with_multipart(GradientsRequest),
    responses={**error_responses(400, 404, 409, 413, 422, 503), **BINARY_OR_PNG},
)
async def gradients(request: Request, state: StateDep) -> Response:
    job = await prepare(request, state, GradientsRequest)
    body, model = job.body, job.model
    target = _form_target(request, body.target)
    names = resolve_layers(model.module, body.layers, state.settings.max_layers) if body.layers else []
    if not names and not body.include_input:
        raise InvalidField("nothing to differentiate: give layers or set include_input to true")
    result = await job.executor.run_exclusive(
        lambda: run_gradients(model, job.inputs, names, target, body.include_input)
    )
    head = {"model": model.name, "targets": result.targets, "scores": result.scores}
    if body.format is not TensorFormat.json:
        rest = head | {"gradients": {k: {"shape": list(v.shape)} for k, v in result.gradients.items()}}
        return await binary_response(body.format.value, result.gradients, rest, state.settings, "gradients")
    numel = sum(g.numel() for g in result.gradients.values())
    content = head | {"gradients": {k: json_tensor(v) for k, v in result.gradients.items()}}
    return await json_response(content, state.settings, numel=numel)


@router.post(
    "/saliency",
    response_model=SaliencyResponse,
    summary="Attribution maps (Captum): gradient, input×gradient, SmoothGrad, Integrated Gradients, Grad-CAM",
    openapi_extra=body_with_multipart(SaliencyRequest),
    responses={**error_responses(400, 404, 409, 413, 422, 503), **BINARY_OR_PNG},
)
async def saliency(request: Request, state: StateDep) -> Response:
    job = await prepare(request, state, SaliencyRequest)
    body, model, settings = job.body, job.model, state.settings
    if body.method is SaliencyMethod.INTEGRATED_GRADIENTS and body.steps > settings.max_ig_steps:
        raise InvalidField(f"steps {body.steps} is over the limit of {settings.max_ig_steps} (max_ig_steps)")
    if body.method is SaliencyMethod.SMOOTHGRAD and body.samples > settings.max_smoothgrad_samples:
        raise InvalidField(
            f"samples {body.samples} is over the limit of {settings.max_smoothgrad_samples} (max_smoothgrad_samples)"
        )
    if body.layer is not None and body.method is not SaliencyMethod.GRADCAM:
        raise InvalidField("layer applies to method gradcam only")
    target = _form_target(request, body.target)
    layer = resolve_layers(model.module, [body.layer], 1)[0] if body.layer is not None else None
    items = await job.executor.run_exclusive(
        lambda: run_saliency(
            model,
            job.inputs,
            body.method,
            target,
            layer=layer,
            steps=body.steps,
            samples=body.samples,
            noise=body.noise,
            seed=body.seed,
            ig_internal_batch_size=settings.ig_internal_batch_size,
            smoothgrad_batch_size=settings.smoothgrad_batch_size,
        )
    )
    if body.format is SaliencyFormat.png:
        heatmaps = [item.heatmap for item in items]
        png = await run_in_threadpool(_overlay, list(job.inputs), heatmaps, model.preprocess, body.alpha)
        return png_response(png, f"saliency-{body.method.value}")
    head = {"model": model.name, "method": body.method.value}
    if body.format is not SaliencyFormat.json:
        tensors = {
            f"{i}:{part}": getattr(item, part) for i, item in enumerate(items) for part in ("attribution", "heatmap")
        }
        rest = head | {"results": [_result(item, model.label(item.target), None) for item in items]}
        return await binary_response(body.format.value, tensors, rest, settings, f"saliency-{body.method.value}")
    numel = sum(item.attribution.numel() + item.heatmap.numel() for item in items)
    content = head | {"results": [_result(item, model.label(item.target), json_tensor) for item in items]}
    return await json_response(content, settings, numel=numel)


def _form_target(request: Request, target: TargetSpec) -> TargetSpec:
    """Multipart `target=7` arrives as `[7]` (form lists are comma-separated): one class for every image."""
    if not request.headers.get("content-type", "").startswith("multipart/form-data") or not isinstance(target, list):
        return target
    if not target or (len(target) == 1 and target[0] in ("null", "none")):
        return None
    return target[0] if len(target) == 1 else target


def _result(item: SaliencyItem, label: str, encode: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"target": item.target, "label": label, "score": item.score, "probability": item.probability}
    if encode is not None:
        out |= {"attribution": encode(item.attribution), "heatmap": encode(item.heatmap)}
    if item.convergence_delta is not None:
        out["convergence_delta"] = item.convergence_delta
    return out


MIN_PICTURE_SIDE = 224


def _overlay(
    inputs: list[torch.Tensor], heatmaps: list[torch.Tensor], preprocess: PreprocessSpec, alpha: float
) -> bytes:
    """Blend each heatmap over its de-normalised input; small inputs (a 32×32 digit) are enlarged to be seen.

    Runs on a worker thread: the event loop runs no torch.
    """
    images = [denormalize(x.float(), preprocess) for x in inputs]
    side = min(images[0].shape[-2:])
    if side < MIN_PICTURE_SIDE:
        factor = -(-MIN_PICTURE_SIDE // side)
        images = [F.interpolate(x[None], scale_factor=factor, mode="nearest")[0] for x in images]
        heatmaps = [F.interpolate(h[None, None].float(), scale_factor=factor, mode="bilinear")[0, 0] for h in heatmaps]
    if len(images) == 1:
        return heatmap_overlay_png(images[0], heatmaps[0], alpha)
    return heatmap_grid_png(images, heatmaps, alpha)
