"""An answer that carries captured tensors (/activations, /interventions) in the format the request asked for."""

from __future__ import annotations

from typing import Any

from fastapi import Response
from starlette.concurrency import run_in_threadpool

from service.api.responses import file_response, json_response, png_response
from service.codecs.pictures import activation_grid_png
from service.codecs.tensors import json_tensor
from service.config import Settings
from service.dtypes import dtype_name
from service.introspection.capture import Captured, captured_outputs, captured_tensors
from service.introspection.tensor_stats import captured_stats
from service.introspection.tokens import TokenLayout
from service.specs.vocab import ActivationFormat


async def captures_answer(
    head: dict[str, Any],
    captured: Captured,
    fmt: ActivationFormat,
    settings: Settings,
    *,
    filename: str,
    picture: tuple[str | None, int] = (None, 64),
    tokens: TokenLayout | None = None,
) -> Response:
    """`head` plus `activations` as JSON tensors, their stats, a binary file (tensors named `<key>:<side>`, the
    rest of the answer as metadata) or a PNG grid of one captured layer (`picture`: its name and channels; a vision
    transformer's patch tokens drawn on their grid, per channel, when `tokens` gives the inputs' layout)."""
    if fmt is ActivationFormat.png:
        layer, channels = picture
        png = await run_in_threadpool(activation_grid_png, captured_outputs(captured), layer, channels, tokens)
        return png_response(png, filename)
    if fmt is ActivationFormat.stats:
        return await json_response(head | {"activations": await run_in_threadpool(captured_stats, captured)}, settings)
    if fmt is not ActivationFormat.json:
        rest = head | {"activations": _shapes(captured)}
        return await file_response(fmt.value, captured_tensors(captured), rest, settings, filename)
    numel = sum(t.numel() for sides in captured.values() for t in sides.values())
    content = head | {"activations": {k: {s: json_tensor(t) for s, t in v.items()} for k, v in captured.items()}}
    return await json_response(content, settings, numel=numel)


def _shapes(captured: Captured) -> dict[str, dict[str, Any]]:
    return {
        key: {side: {"shape": list(t.shape), "dtype": dtype_name(t.dtype)} for side, t in sides.items()}
        for key, sides in captured.items()
    }
