"""JSON error answers sent by pure ASGI middleware (outside FastAPI's handlers), in the path's envelope."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import orjson
from starlette.types import Send

Envelopes = Mapping[str, Callable[[str, int], bytes]]  # path prefix -> (detail, status) -> the error body


def error_body(envelopes: Envelopes, path: str, detail: str, status: int) -> bytes:
    """`detail` in the envelope of the first prefix of `path` in `envelopes`, else `{"detail": ...}`."""
    envelope = next((make for prefix, make in envelopes.items() if path.startswith(prefix)), None)
    return envelope(detail, status) if envelope is not None else orjson.dumps({"detail": detail})


async def send_error(send: Send, status: int, body: bytes, headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
