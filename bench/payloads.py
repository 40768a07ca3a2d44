"""Requests exactly as a client sends them, encoded once up front: JSON bodies and multipart uploads."""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import orjson


@dataclass(frozen=True)
class Payload:
    """One request exactly as sent on the wire, encoded once (the client's encoding cost is not measured)."""

    name: str
    path: str
    content: bytes
    headers: dict[str, str]
    images: int = 1


def json_payload(name: str, path: str, body: Mapping[str, Any], images: int = 1) -> Payload:
    return Payload(name, path, orjson.dumps(body), {"content-type": "application/json"}, images)


def multipart_payload(
    name: str, path: str, fields: Mapping[str, str], files: Sequence[tuple[str, bytes, str]]
) -> Payload:
    """A multipart form like `curl -F k=v -F image=@file`: `files` are (file name, bytes, content type)."""
    request = httpx.Request("POST", "http://127.0.0.1/", data=dict(fields), files=[("image", f) for f in files])
    content = request.read()
    headers = {"content-type": request.headers["content-type"]}
    return Payload(name, path, content, headers, len(files))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
