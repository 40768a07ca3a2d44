"""Domain errors as gRPC status codes, with the same detail REST answers (and `retry-after` for 503s)."""

from __future__ import annotations

from typing import Any

import grpc

from service.errors import HookserveError

STATUS_CODES: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.FAILED_PRECONDITION,  # the model is loading or failed, or exists already
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    499: grpc.StatusCode.CANCELLED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def status_code(status: int) -> grpc.StatusCode:
    """The gRPC code of an HTTP-like status (500 and anything unlisted: INTERNAL)."""
    return STATUS_CODES.get(status, grpc.StatusCode.INTERNAL)


def detail_text(detail: Any) -> str:
    """A detail (a string, or a list of field problems) as one line."""
    if isinstance(detail, str):
        return detail
    if isinstance(detail, list):
        return "; ".join(str(item.get("msg", item)) if isinstance(item, dict) else str(item) for item in detail)
    return str(detail)


def trailing_metadata(error: HookserveError) -> tuple[tuple[str, str], ...]:
    """`retry-after` for a 503 (queue full, device out of memory), as REST's header says."""
    return tuple((key.lower(), value) for key, value in error.headers.items() if key.lower() == "retry-after")
