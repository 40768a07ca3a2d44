"""Every error of the TorchServe front in TorchServe's envelope: `{"code": 404, "type": "ModelNotFoundException",
"message": "..."}`, with the detail hookserve gives elsewhere."""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from service.codecs.torchserve import error_body
from service.errors import HookserveError

log = logging.getLogger("hookserve.torchserve")


def error_response(status: int, detail: Any, headers: Mapping[str, str] | None = None) -> Response:
    return Response(
        error_body(status, _text(detail)), status_code=status, headers=headers, media_type="application/json"
    )


def _text(detail: Any) -> str:
    if isinstance(detail, list):
        return "; ".join(f"{'.'.join(map(str, d.get('loc', [])))}: {d.get('msg', d)}" for d in detail)
    return str(detail)


def as_response(exc: Exception) -> Response | None:
    """The envelope for an error a route raised; None for one to re-raise."""
    if isinstance(exc, HookserveError):
        return error_response(exc.status, exc.detail, exc.headers)
    if isinstance(exc, RequestValidationError):  # a bad query parameter: TorchServe says 400
        problems = [{"loc": e.get("loc", ()), "msg": e.get("msg", "")} for e in exc.errors()]
        return error_response(400, problems)
    if isinstance(exc, StarletteHTTPException):
        return error_response(exc.status_code, exc.detail, exc.headers)
    return None


class TorchServeRoute(APIRoute):
    """A route of the TorchServe front: whatever it raises is answered in the envelope (never a traceback)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()

        async def envelope(request: Request) -> Response:
            try:
                return await handle(request)
            except ClientDisconnect:
                raise
            except Exception as exc:
                answer = as_response(exc)
                if answer is not None:
                    return answer
                log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
                return error_response(500, "internal server error; the server log has the details")

        return envelope
