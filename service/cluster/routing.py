"""Which model a request is about: from its path, a query parameter, or its body (JSON or multipart).

The router of the sharded layout sends each request to the group that serves that model.
A body is read as the app reads it: a multipart form when `service.api.bodies.is_multipart`
says so, JSON whatever else its Content-Type says. A body it cannot read (bad JSON, no
`model` field) names no model: the request then goes to any group, whose app answers with
the same 400/422 a single process gives.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qs

import orjson
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from service.api.bodies import is_multipart
from service.cluster.messages import ForwardRequest

MODEL_PATHS = (
    re.compile(r"^/models/(?P<name>[^/]+)(?:/.*)?$"),
    re.compile(r"^/v2/models/(?P<name>[^/]+)(?:/.*)?$"),
    re.compile(r"^/v2/repository/models/(?P<name>[^/]+)/(?:load|unload)$"),
)
ADMIN = (
    ("POST", re.compile(r"^/models/?$")),
    ("DELETE", re.compile(r"^/models/[^/]+/?$")),
    ("POST", re.compile(r"^/v2/repository/models/[^/]+/(?:load|unload)$")),
)
QUERY_MODEL = {"/checkpoints/inspect": "compare_to"}  # a path whose model is a query parameter
CHUNK = 64 * 1024


def is_admin(method: str, path: str) -> bool:
    """Calls that change the model set: load and unload."""
    return any(method == m and pattern.match(path) for m, pattern in ADMIN)


def model_in_path(path: str) -> str | None:
    for pattern in MODEL_PATHS:
        found = pattern.match(path)
        if found:
            return found["name"]
    return None


def model_in_query(path: str, query_string: bytes) -> str | None:
    key = QUERY_MODEL.get(path)
    if key is None:
        return None
    values = parse_qs(query_string.decode("latin-1")).get(key)
    return values[0] if values else None


def model_in_json(body: bytes) -> str | None:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    model = data.get("model") if isinstance(data, dict) else None
    return model if isinstance(model, str) else None


def model_in_multipart(boundary: bytes, body: bytes, charset: str = "utf-8") -> str | None:
    """The value of the form field `model`, reading only as far as needed, decoded as Starlette decodes form
    fields for the app (the Content-Type's charset, latin-1 where that fails)."""
    state: dict[str, bytes | bool | None] = {"field": b"", "value": b"", "name": None, "in_model": False, "found": None}
    header: dict[str, bytes] = {"field": b"", "value": b""}

    def on_header_field(data: bytes, start: int, end: int) -> None:
        header["field"] += data[start:end]

    def on_header_value(data: bytes, start: int, end: int) -> None:
        header["value"] += data[start:end]

    def on_header_end() -> None:
        if header["field"].lower() == b"content-disposition":
            _, params = parse_options_header(header["value"])
            state["name"] = params.get(b"name")
        header["field"] = header["value"] = b""

    def on_headers_finished() -> None:
        state["in_model"] = state["name"] == b"model"
        state["value"] = b""

    def on_part_data(data: bytes, start: int, end: int) -> None:
        if state["in_model"]:
            state["value"] = bytes(state["value"] or b"") + data[start:end]

    def on_part_end() -> None:
        if state["in_model"] and state["found"] is None:
            state["found"] = state["value"]
        state["name"] = None
        state["in_model"] = False

    parser = MultipartParser(
        boundary,
        {
            "on_header_field": on_header_field,
            "on_header_value": on_header_value,
            "on_header_end": on_header_end,
            "on_headers_finished": on_headers_finished,
            "on_part_data": on_part_data,
            "on_part_end": on_part_end,
        },
    )
    try:
        for offset in range(0, len(body), CHUNK):
            parser.write(body[offset : offset + CHUNK])
            if state["found"] is not None:
                break
    except MultipartParseError:
        return None
    found = state["found"]
    if not isinstance(found, bytes):
        return None
    try:
        return found.decode(charset)
    except (UnicodeDecodeError, LookupError):
        return found.decode("latin-1")


def model_in_body(request: ForwardRequest) -> str | None:
    """`model` of a JSON body or a multipart form; None when there is none or the body is unreadable."""
    if not request.body:
        return None
    content_type = request.header(b"content-type")
    if not is_multipart(content_type):
        return model_in_json(request.body)
    params = parse_options_header(content_type)[1]
    boundary = params.get(b"boundary")
    charset = params.get(b"charset", b"utf-8").decode("latin-1")
    return model_in_multipart(boundary, request.body, charset) if boundary else None


def model_of(request: ForwardRequest) -> str | None:
    """The model a request names, wherever it names it."""
    return (
        model_in_path(request.path)
        or model_in_query(request.path, request.query_string)
        or (model_in_body(request) if request.method in ("POST", "PUT", "PATCH") else None)
    )
