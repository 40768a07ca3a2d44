"""Domain errors. Core code raises these; `service.api.errors` maps them to HTTP.

Each class documents the status code it becomes. The message (`detail`) is shown to the
client, so it must never carry a traceback, a server path or a library version.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from typing import Any

_ABSOLUTE_PATH = re.compile(r"(?<![\w.])(?:/[\w.@+-]+){2,}")


class HookserveError(Exception):
    """Base of every error a client may see. `status` is the HTTP status code."""

    status: int = 500

    def __init__(self, detail: Any, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail if isinstance(detail, str) else repr(detail))
        self.detail = detail
        self.headers = headers or {}


class BadInput(HookserveError):
    """400: the input could not be decoded (bad base64, not an image, truncated bytes)."""

    status = 400


class Unauthorized(HookserveError):
    """401: missing or wrong admin token."""

    status = 401


class Forbidden(HookserveError):
    """403: admin calls disabled (no token configured) or a path outside the model dir."""

    status = 403


class NotFound(HookserveError):
    """404: unknown model, tensor key or resource."""

    status = 404


def unknown_model(name: str, served: Iterable[str]) -> NotFound:
    """404 for a model nobody serves, naming the served one closest to `name` if any is close: worded alike by one
    process and by the cluster's router, which knows every group's models."""
    close = difflib.get_close_matches(name, list(served), n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return NotFound(f"no model named {name!r}; {hint}GET /models lists them")


class Conflict(HookserveError):
    """409: the model exists but is not ready (loading or failed), or already exists."""

    status = 409


class TooLarge(HookserveError):
    """413: a body, image, item count or response over its limit."""

    status = 413


class InvalidField(HookserveError):
    """422: a field is well-formed but invalid for this model (unknown layer, bad target...)."""

    status = 422


class Unavailable(HookserveError):
    """503: queue full or device out of memory; comes with `Retry-After`."""

    status = 503

    def __init__(self, detail: Any, *, retry_after: int = 1) -> None:
        super().__init__(detail, headers={"Retry-After": str(retry_after)})


class DeadlineExceeded(HookserveError):
    """504: the request's deadline passed before its job finished."""

    status = 504


class ModelLoadError(Exception):
    """A model failed to build or load; stored in INFO `error`, never raised to a client."""


def scrub_paths(text: str) -> str:
    """Replace absolute file paths by their last part: error texts must not reveal the server's layout."""
    return _ABSOLUTE_PATH.sub(lambda m: m.group(0).rsplit("/", 1)[-1], text)


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type name when the message is empty), for short details."""
    return next(iter(str(exc).strip().splitlines()), "") or type(exc).__name__
