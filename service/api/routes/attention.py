"""POST /attention: a vision transformer's attention probabilities per block, head and query row."""

from __future__ import annotations

from typing import Any

import torch
from fastapi import APIRouter, Request, Response
from starlette.concurrency import run_in_threadpool

from service.api.bodies import parse_body
from service.api.deps import PlaneDep
from service.api.observability import set_request_model
from service.api.openapi import BINARY_OR_PNG, body_with_multipart, error_responses
from service.api.responses import file_response, json_response, png_response
from service.codecs.pictures import attention_png
from service.codecs.tensors import json_tensor
from service.config import Settings
from service.dataplane.attention import Attention
from service.dtypes import dtype_name
from service.introspection.tensor_stats import tensor_summary
from service.introspection.tokens import patch_grid, token_names
from service.schemas.attention import AttentionRequest, AttentionResponse
from service.specs.vocab import ActivationFormat

router = APIRouter(tags=["introspection"])


@router.post(
    "/attention",
    response_model=AttentionResponse,
    summary="Attention probabilities of a vision transformer's blocks, per head and query row (JSON, stats, "
    "safetensors, npz, or a PNG of the maps over the image)",
    openapi_extra=body_with_multipart(AttentionRequest),
    responses={**error_responses(400, 404, 409, 413, 422, 503), **BINARY_OR_PNG},
)
async def attention(request: Request, plane: PlaneDep) -> Response:
    parsed = await parse_body(request, AttentionRequest, plane.settings)
    set_request_model(request, parsed.body.model)
    result = await plane.attention(parsed.body, parsed.images)
    return await _answer(result, parsed.body, plane.settings)


async def _answer(result: Attention, body: AttentionRequest, settings: Settings) -> Response:
    maps = result.probabilities
    if body.format is ActivationFormat.png:
        png = await run_in_threadpool(_picture, result, body.alpha)
        return png_response(png, "attention")
    layout = result.tokens
    head: dict[str, Any] = {
        "model": result.model.name,
        "tokens": layout.describe() if layout is not None else None,
        "heads": result.heads,
        "queries": result.queries,
        "query_names": token_names(result.queries, layout) if layout is not None else [str(q) for q in result.queries],
        "predictions": result.predictions,
    }
    if body.format is ActivationFormat.stats:
        stats = await run_in_threadpool(lambda: {key: tensor_summary(t) for key, t in maps.items()})
        return await json_response(head | {"attention": stats}, settings)
    if body.format is not ActivationFormat.json:
        shapes = {key: {"shape": list(t.shape), "dtype": dtype_name(t.dtype)} for key, t in maps.items()}
        return await file_response(body.format.value, maps, head | {"attention": shapes}, settings, "attention")
    numel = sum(t.numel() for t in maps.values())
    tensors = {key: json_tensor(t) for key, t in maps.items()}
    return await json_response(head | {"attention": tensors}, settings, numel=numel)


def _picture(result: Attention, alpha: float) -> bytes:
    """The first input's maps from the first query row over the patch tokens: a row per block, a column per head."""
    layout = result.tokens
    assert layout is not None  # the data plane refuses png without a patch grid
    rows = []
    for t in result.probabilities.values():
        first = t[0, :, 0, :]  # [heads, T] of the first input's first query
        rows.append(patch_grid(first[None].transpose(1, 2), layout)[0])  # [heads, rows, cols]
    return attention_png(result.inputs[0], torch.stack(rows), result.model.preprocess, alpha)
