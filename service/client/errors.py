"""What a failed call raises: one exception per HTTP status class, each carrying `status` and the server's `detail`.

A caller can catch `HookserveError` for everything, or a subclass for the cases it handles
(`ServiceUnavailable` after the retries ran out, `NotFound` for an unknown model, ...).
Transport failures (no server, connection reset, timeout) are `TransportError`s with
`status` None, so one `except HookserveError` covers a whole script.
"""

from __future__ import annotations

from typing import Any

import httpx


class HookserveError(Exception):
    """Base of every error the client raises. `status` is the HTTP status (None without an answer).

    `detail` is always one line of text; `errors` holds the server's per-field problems when it named any
    (`[{"loc": ["top_k"], "msg": "...", "type": "..."}]`, pydantic's shape), else it is empty."""

    status: int | None = None

    def __init__(self, detail: Any, *, status: int | None = None, headers: dict[str, str] | None = None) -> None:
        self.errors: list[dict[str, Any]] = field_errors(detail)
        self.detail: str = detail_text(detail)
        if status is not None:
            self.status = status
        self.headers = headers or {}
        super().__init__(self._text())

    def _text(self) -> str:
        prefix = f"{self.status} " if self.status is not None else ""
        return f"{prefix}{self.detail}"


class BadRequest(HookserveError):
    """400: an input could not be decoded (not an image, bad base64, truncated bytes)."""

    status = 400


class Unauthorized(HookserveError):
    """401: the admin token is missing or wrong."""

    status = 401


class Forbidden(HookserveError):
    """403: admin calls are disabled on the server, or a server-side path is outside its model dir."""

    status = 403


class NotFound(HookserveError):
    """404: unknown model, tensor key or path."""

    status = 404


class Conflict(HookserveError):
    """409: the model exists but is not ready (loading or failed), or already exists."""

    status = 409


class TooLarge(HookserveError):
    """413: a body, image or answer over a server limit; the detail says which and what to ask for instead."""

    status = 413


class InvalidRequest(HookserveError):
    """422: a field is invalid (unknown layer, bad target, ...); unknown layers come with the closest names."""

    status = 422


class ServiceUnavailable(HookserveError):
    """503: queue full or device out of memory, still so after the client's retries. `retry_after` in seconds."""

    status = 503

    @property
    def retry_after(self) -> float | None:
        return parse_retry_after(self.headers.get("retry-after"))


class DeadlineExceeded(HookserveError):
    """504: the server's per-request deadline passed before the job finished."""

    status = 504


class ServerError(HookserveError):
    """Any other status: a 500 is a server bug (its log has the details)."""


class TransportError(HookserveError):
    """No HTTP answer: connection refused or reset, a protocol error."""


class RequestTimeout(TransportError):
    """The call's timeout passed before the answer arrived."""


_BY_STATUS: dict[int, type[HookserveError]] = {
    cls.status: cls
    for cls in (
        BadRequest,
        Unauthorized,
        Forbidden,
        NotFound,
        Conflict,
        TooLarge,
        InvalidRequest,
        ServiceUnavailable,
        DeadlineExceeded,
    )
}


def error_from_response(response: httpx.Response) -> HookserveError:
    """The exception for a non-2xx answer, with the `detail` of its JSON body (or its text)."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and "detail" in body:
        detail: Any = body["detail"]
    elif isinstance(body, dict) and "error" in body:  # /v2 answers {"error": ...}
        detail = body["error"]
    else:
        detail = response.text.strip() or response.reason_phrase
    cls = _BY_STATUS.get(response.status_code, ServerError)
    return cls(detail, status=response.status_code, headers=dict(response.headers))


def field_errors(detail: Any) -> list[dict[str, Any]]:
    """The per-field problems of a pydantic-style detail list; [] for any other detail."""
    if isinstance(detail, list) and detail and all(isinstance(d, dict) for d in detail):
        return [dict(d) for d in detail]
    return []


def detail_text(detail: Any) -> str:
    """A one-line rendering of a `detail`: pydantic error lists become `loc: msg; loc: msg`."""
    if isinstance(detail, str):
        return detail
    if isinstance(detail, list) and all(isinstance(d, dict) for d in detail):
        parts = []
        for item in detail:
            loc = ".".join(str(p) for p in item.get("loc", []))
            parts.append(f"{loc}: {item.get('msg', item)}" if loc else str(item.get("msg", item)))
        return "; ".join(parts)
    return str(detail)


def parse_retry_after(value: str | None) -> float | None:
    """`Retry-After` in seconds: delta-seconds, or an HTTP date (RFC 9110 10.2.3); None when absent or invalid."""
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    import email.utils
    import time

    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())
