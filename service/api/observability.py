"""Request ids, one JSON access-log line per request, and the request metrics (pure ASGI middleware).

`install_observability(app, settings)` adds the middleware and `GET /metrics`;
`configure_logging(level)` makes every log record one JSON line on stderr.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, TextIO

import orjson
from fastapi import FastAPI
from starlette.datastructures import MutableHeaders
from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.metrics import Metrics, metrics_of
from service.api.request_ids import REQUEST_ID_HEADER
from service.api.request_ids import request_id as request_id_of
from service.config import Settings

UNMATCHED_ROUTE = "<unmatched>"
_request_id: ContextVar[str | None] = ContextVar("hookserve_request_id", default=None)
access_log = logging.getLogger("hookserve.access")


def current_request_id() -> str | None:
    """The id of the request being served in this context (None outside a request)."""
    return _request_id.get()


def set_request_model(conn: HTTPConnection, name: str) -> None:
    """Name the model a request is for (routers that read it from the body call this)."""
    conn.state.model = name


class ObservabilityMiddleware:
    """Assigns the request id, times the request, logs it and counts it by route template."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = request_id_of(scope.get("headers", []))
        scope.setdefault("state", {})["request_id"] = request_id
        token = _request_id.set(request_id)
        status = 500  # what the client gets if the app raises before answering
        started = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message.setdefault("headers", [])
                MutableHeaders(scope=message)[REQUEST_ID_HEADER] = request_id
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            self._record(scope, status, time.perf_counter() - started, request_id)
            _request_id.reset(token)

    def _record(self, scope: Scope, status: int, seconds: float, request_id: str) -> None:
        route = _route_template(scope)
        model = _model_name(scope, route)
        if model and status >= 400 and not self.metrics.knows_model(model):
            model = ""  # an unknown name from a failed request must not become a label value
        method: str = scope["method"]
        self.metrics.observe_request(route, method, model, status, seconds)
        fields: dict[str, Any] = {
            "request_id": request_id,
            "method": method,
            "path": scope["path"],
            "route": route,
            "status": status,
            "duration_ms": round(seconds * 1000.0, 3),
        }
        if model:
            fields["model"] = model
        access_log.log(_level(status), "request", extra=fields)


def _level(status: int) -> int:
    """Server faults are errors; 503 (not ready, queue full, out of memory) and 504 are load, a warning."""
    if status in (503, 504):
        return logging.WARNING
    return logging.ERROR if status >= 500 else logging.INFO


def _route_template(scope: Scope) -> str:
    """`/models/{name}`, not the raw path (with any include prefix); `<unmatched>` when no route is known."""
    effective = (scope.get("fastapi") or {}).get("effective_route_context")  # FastAPI's prefixed view of the route
    for route in (effective, scope.get("route")):
        template = getattr(route, "path_format", None)
        if isinstance(template, str) and template:
            return template
    return _schema_template(scope)


def _schema_template(scope: Scope) -> str:
    """For answers given before routing (413 from the body limit) or with no route: match the OpenAPI paths."""
    app = scope.get("app")
    if not isinstance(app, FastAPI):
        return UNMATCHED_ROUTE
    table: list[tuple[re.Pattern[str], str]] | None = getattr(app.state, "route_templates", None)
    if table is None:
        paths = app.openapi().get("paths", {})
        table = [(re.compile("^" + re.sub(r"\\{[^/]+?\\}", "[^/]+", re.escape(p)) + "$"), p) for p in paths]
        app.state.route_templates = table
    path: str = scope["path"]
    return next((template for pattern, template in table if pattern.match(path)), UNMATCHED_ROUTE)


def _model_name(scope: Scope, route: str) -> str:
    """`request.state.model` if a router set it, else a `{name}`/`{model_name}` path parameter under /models/."""
    name = (scope.get("state") or {}).get("model")
    if not name and "models/{" in route:
        params = scope.get("path_params") or {}
        name = params.get("model_name") or params.get("name")
    return name if isinstance(name, str) else ""


def install_observability(app: FastAPI, settings: Settings) -> Metrics:
    """Add the middleware (call after every other `add_middleware` but `EveryAnswerHeadersMiddleware`'s).

    Idempotent: a second call on the same app returns the installed Metrics. `settings` is
    accepted so the wiring reads like the other installers; the log level is applied by
    `configure_logging(settings.log_level)` in the process entry point.
    """
    if getattr(app.state, "observability_installed", False):
        return metrics_of(app)
    metrics = metrics_of(app)
    app.add_middleware(ObservabilityMiddleware, metrics=metrics)
    app.state.observability_installed = True
    return metrics


# ---- structured logs ----------------------------------------------------------------------
_RECORD_FIELDS = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "color_message"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts, level, logger, msg, request_id, then any `extra=` fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None) or _request_id.get()
        if request_id:
            out["request_id"] = request_id
        for key, value in vars(record).items():
            if key not in _RECORD_FIELDS and key not in out and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return orjson.dumps(out, default=str).decode()


class JsonHandler(logging.StreamHandler[TextIO]):
    """The root handler `configure_logging` installs (found again and replaced on a second call)."""


def configure_logging(level: str, stream: TextIO | None = None) -> None:
    """JSON lines on `stream` (stderr) at `level` ("debug" ... "error", as Settings.log_level).

    uvicorn's loggers propagate to this handler; its access logger is silenced because the
    middleware writes the access line (run uvicorn with `log_config=None, access_log=False`).
    """
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, JsonHandler):
            root.removeHandler(handler)
    handler = JsonHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter())
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)
