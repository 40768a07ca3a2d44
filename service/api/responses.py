"""Encoding answers: orjson with NumPy arrays, binary files, size limits (413 with advice)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson
import torch
from fastapi import Response
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Scope, Send

from service.codecs.binary import Buffer, binary_size
from service.codecs.formats import file_format
from service.codecs.tensors import json_size_lower_bound
from service.config import Settings
from service.errors import TooLarge

JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
PIECE_BYTES = 1 << 20  # the most a file answer hands the server at once
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
    parts = await run_in_threadpool(row.encode, tensors, rest)
    return PartsResponse(
        parts,
        media_type=row.media_type,
        headers={"Content-Disposition": f'attachment; filename="{filename}.{row.extension}"'},
    )


class PartsResponse(Response):
    """A body sent as the given parts, in pieces of at most `PIECE_BYTES`, with its `Content-Length`.

    The parts may be views of tensors (a safetensors file is its header and then each tensor's
    bytes), so the answer is never joined into one copy: a 151 MiB answer raised the server's
    peak memory by ~245 MB instead of ~405 MB. Pieces matter on the event loop: asyncio (Python
    3.11) copies whatever the socket does not take at once into the transport's buffer, holding
    the GIL (py-spy: ~2 ms per 10 MB answer under load, while the lanes' hooks waited for it);
    uvicorn takes the next piece only once that buffer has drained below its high-water mark.
    """

    def __init__(self, parts: Sequence[Buffer], media_type: str, headers: Mapping[str, str]) -> None:
        self.parts = [memoryview(part).cast("B") for part in parts]
        self.status_code = 200
        self.media_type = media_type
        self.background = None
        self.init_headers({**headers, "content-length": str(sum(part.nbytes for part in self.parts))})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        for part in self.parts:
            for start in range(0, part.nbytes, PIECE_BYTES):
                await send({"type": "http.response.body", "body": part[start : start + PIECE_BYTES], "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def png_response(body: bytes, filename: str) -> Response:
    return Response(body, media_type="image/png", headers={"Content-Disposition": f'inline; filename="{filename}.png"'})
