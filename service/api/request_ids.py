"""Request ids: the client's `X-Request-ID` when it is a plain token, else a new one (no torch, no FastAPI).

The app's observability middleware and the cluster's front both take a request's id this way,
so an id the front forwards is the one the app logs and answers with.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable

REQUEST_ID_HEADER = "X-Request-ID"
_VALID_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")


def incoming_request_id(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The first `x-request-id` of ASGI headers (lower-case names) if it is 1-128 of `A-Za-z0-9._-`, else None."""
    for key, value in headers:
        if key == b"x-request-id":
            text = value.decode("latin-1")
            return text if _VALID_ID.fullmatch(text) else None
    return None


def request_id(headers: Iterable[tuple[bytes, bytes]]) -> str:
    """The client's id when valid, else a new random one."""
    return incoming_request_id(headers) or uuid.uuid4().hex
