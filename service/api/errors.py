"""The one place that turns errors into HTTP answers: `{"detail": ...}`, never a traceback.

/v2 routes answer in their protocol's envelope instead (`service.api.routes.v2.OipRoute`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from service.dataplane.dry_run import DryRunAnswer
from service.errors import HookserveError

log = logging.getLogger("hookserve.api")
CLIENT_CLOSED_REQUEST = 499  # nginx's code: the client left before its body arrived; nobody reads the answer


def _error(status: int, detail: Any, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status, headers=headers)


def clean_validation_errors(errors: Any) -> list[dict[str, Any]]:
    """Pydantic errors without echoing huge inputs or internal URLs."""
    cleaned = []
    for err in errors:
        item = {"loc": list(err.get("loc", ())), "msg": str(err.get("msg", "")), "type": err.get("type", "")}
        cleaned.append(item)
    return cleaned


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(HookserveError)
    async def _domain(request: Request, exc: HookserveError) -> JSONResponse:
        return _error(exc.status, exc.detail, exc.headers)

    @app.exception_handler(DryRunAnswer)
    async def _dry_run(request: Request, exc: DryRunAnswer) -> JSONResponse:
        return JSONResponse(exc.report)  # a dry run's estimate: 200, nothing ran

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(422, clean_validation_errors(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error(exc.status_code, exc.detail, exc.headers)

    @app.exception_handler(ClientDisconnect)
    async def _gone(request: Request, exc: ClientDisconnect) -> JSONResponse:
        log.info("client disconnected during %s %s", request.method, request.url.path)
        return _error(CLIENT_CLOSED_REQUEST, "client disconnected before the request body was complete")

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return _error(500, "internal server error; the server log has the details")


def as_text(detail: Any) -> str:
    """A detail (a string, or pydantic's error list) as one line of text."""
    if isinstance(detail, str):
        return detail
    if isinstance(detail, list):
        return "; ".join(f"{'.'.join(map(str, d.get('loc', [])))}: {d.get('msg', d)}" for d in detail)
    return str(detail)
