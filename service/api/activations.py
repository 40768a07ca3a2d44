"""POST /activations: inputs/outputs of named layers, captured by hooks that live for this request only."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from starlette.concurrency import run_in_threadpool

from service.api.openapi import body_with_multipart, error_responses
from service.api.responses import OCTET, binary_response, json_response, png_response
from service.api.running import prepare
from service.api.state import StateDep
from service.codecs.pictures import feature_grid_png
from service.codecs.tensors import json_tensor
from service.dtypes import dtype_name
from service.errors import InvalidField
from service.introspection.capture import Captured
from service.introspection.layers import resolve_layers
from service.introspection.tensor_stats import tensor_summary
from service.runtime.activations_job import run_activations
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
async def activations(request: Request, state: StateDep) -> Response:
    job = await prepare(request, state, ActivationsRequest)
    body, model = job.body, job.model
    names = resolve_layers(model.module, body.layers, state.settings.max_layers)
    result = await job.executor.run_exclusive(
        lambda: run_activations(model, job.inputs, names, body.capture, body.reduce)
    )
    captured = result.captured
    head = {"model": model.name, "predictions": result.predictions}
    fmt = body.format
    if fmt is ActivationFormat.png:
        return png_response(await run_in_threadpool(_grid, captured, body.png_layer, body.channels), "activations")
    if fmt in (ActivationFormat.safetensors, ActivationFormat.npz):
        tensors = {f"{key}:{side}": t for key, sides in captured.items() for side, t in sides.items()}
        rest = head | {"activations": _shapes(captured)}
        return await binary_response(fmt.value, tensors, rest, state.settings, "activations")
    if fmt is ActivationFormat.stats:
        stats = await run_in_threadpool(_stats, captured)
        return await json_response(head | {"activations": stats}, state.settings)
    numel = sum(t.numel() for sides in captured.values() for t in sides.values())
    content = head | {"activations": {k: {s: json_tensor(t) for s, t in v.items()} for k, v in captured.items()}}
    return await json_response(content, state.settings, numel=numel)


def _shapes(captured: Captured) -> dict[str, dict[str, Any]]:
    return {
        key: {side: {"shape": list(t.shape), "dtype": dtype_name(t.dtype)} for side, t in sides.items()}
        for key, sides in captured.items()
    }


def _stats(captured: Captured) -> dict[str, dict[str, Any]]:
    return {key: {side: tensor_summary(t) for side, t in sides.items()} for key, sides in captured.items()}


def _grid(captured: Captured, layer: str | None, channels: int) -> bytes:
    outputs = {key: sides["output"] for key, sides in captured.items() if "output" in sides}
    if not outputs:
        raise InvalidField("format=png draws layer outputs; capture 'output' or 'both'")
    if layer is None:
        candidates = [k for k, t in outputs.items() if t.ndim >= 3]
        if not candidates:
            raise InvalidField("format=png needs a layer whose output has channels and spatial dims ([N, C, H, W])")
        layer = candidates[0]
    if layer not in outputs:
        raise InvalidField(f"png_layer {layer!r} is not among the captured layers {sorted(outputs)}")
    fmap = outputs[layer][0]
    if fmap.ndim == 1:
        fmap = fmap[:, None, None]
    elif fmap.ndim == 2:
        fmap = fmap[None]
    elif fmap.ndim > 3:
        raise InvalidField(f"png: {layer!r} output has shape {list(outputs[layer].shape)}; need [N, C, H, W]")
    return feature_grid_png(fmap.float(), channels, None)
