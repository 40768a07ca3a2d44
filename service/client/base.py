"""What `Client` and `AsyncClient` share: settings, request arguments, and reading an answer."""

from __future__ import annotations

import os
from typing import Any, TypeVar

import httpx

from service.client.calls import Call, ClientDefault, TimeoutArg, Wire
from service.client.errors import RequestTimeout, TransportError, error_from_response
from service.client.retry import RETRY_STATUSES, Retry

T = TypeVar("T")
DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_TIMEOUT = 120.0  # the server's own default deadline (HOOKSERVE_REQUEST_TIMEOUT_S)
TOKEN_ENV = "HOOKSERVE_ADMIN_TOKEN"


class ClientBase:
    """Settings of a client. `token` defaults to `$HOOKSERVE_ADMIN_TOKEN` and is sent on admin calls only."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        token: str | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        retry: Retry | None = None,
        wire: Wire | str = Wire.safetensors,
    ) -> None:
        self.url = url.rstrip("/")
        self.token = token if token is not None else os.environ.get(TOKEN_ENV) or None
        self.timeout = timeout
        self.retry = retry if retry is not None else Retry()
        self.wire = Wire(wire)

    def _request_kwargs(self, call: Call[Any], body_kwargs: dict[str, Any], timeout: TimeoutArg) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {self.token}"} if call.admin and self.token else {}
        return {
            "method": call.method,
            "url": call.path,
            "params": call.params,
            "headers": headers,
            "timeout": self.timeout if isinstance(timeout, ClientDefault) else timeout,
            **body_kwargs,
        }

    def _retry_delay(self, call: Call[Any], response: httpx.Response, attempt: int) -> float | None:
        """Seconds to wait before sending again, or None to answer with this response."""
        if response.status_code not in RETRY_STATUSES or response.status_code in call.ok:
            return None
        return self.retry.delay(attempt, response.headers.get("retry-after"))

    @staticmethod
    def _answer(call: Call[T], response: httpx.Response) -> T:
        if not response.is_success and response.status_code not in call.ok:
            raise error_from_response(response)
        return call.parse(response)

    @staticmethod
    def _transport_error(call: Call[Any], exc: httpx.TransportError) -> TransportError:
        where = f"{call.method} {call.path}"
        if isinstance(exc, httpx.TimeoutException):
            return RequestTimeout(f"{where}: no answer within the timeout ({type(exc).__name__})")
        return TransportError(f"{where}: {type(exc).__name__}: {exc}")
