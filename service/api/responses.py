"""Encoding answers: orjson with NumPy arrays, binary files, size limits (413 with advice)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
import torch
from fastapi import Response
from starlette.concurrency import run_in_threadpool

from service.codecs.binary import binary_size
from service.codecs.formats import file_format
from service.codecs.tensors import json_size_lower_bound
from service.config import Settings
from service.errors import TooLarge

JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
TOO_BIG_ADVICE = (
    "ask for format=stats, a reduce (mean/max), fewer layers or inputs, or a binary format (safetensors/npz)"
)


class ORJSONResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        if isinstance(content, bytes):
            return content
        return orjson.dumps(content, option=JSON_OPTIONS)


def encode_json(content: Any, limit: int, numel: int = 0) -> bytes:
    if json_size_lower_bound(numel) > limit:
        raise TooLarge(
            f"the JSON answer would exceed the {limit}-byte limit (max_json_response_bytes); {TOO_BIG_ADVICE}"
        )
    body = orjson.dumps(content, option=JSON_OPTIONS)
    if len(body) > limit:
        raise TooLarge(
            f"the JSON answer is {len(body)} bytes, over the {limit}-byte limit "
            f"(max_json_response_bytes); {TOO_BIG_ADVICE}"
        )
    return body


async def json_response(content: Any, settings: Settings, numel: int = 0, status_code: int = 200) -> Response:
    """Encode off the event loop when the answer is big (DESIGN.md invariant 4)."""
    if numel > 4096:
        body = await run_in_threadpool(encode_json, content, settings.max_json_response_bytes, numel)
    else:
        body = encode_json(content, settings.max_json_response_bytes, numel)
    return ORJSONResponse(body, status_code=status_code)


def check_binary_size(tensors: Mapping[str, torch.Tensor], settings: Settings) -> None:
    size = binary_size(tensors)
    if size > settings.max_binary_response_bytes:
        raise TooLarge(
            f"the binary answer would be {size} bytes, over the {settings.max_binary_response_bytes}-byte limit "
            "(max_binary_response_bytes); ask for fewer layers or inputs, or a reduce"
        )


async def file_response(
    fmt: str, tensors: Mapping[str, torch.Tensor], rest: Mapping[str, Any], settings: Settings, filename: str
) -> Response:
    """Tensors (and the rest of the answer, as metadata) in one of `service.codecs.formats`' file formats."""
    check_binary_size(tensors, settings)
    row = file_format(fmt)
    body = await run_in_threadpool(row.encode, tensors, rest)
    return Response(
        body,
        media_type=row.media_type,
        headers={"Content-Disposition": f'attachment; filename="{filename}.{row.extension}"'},
    )


def png_response(body: bytes, filename: str) -> Response:
    return Response(body, media_type="image/png", headers={"Content-Disposition": f'inline; filename="{filename}.png"'})
