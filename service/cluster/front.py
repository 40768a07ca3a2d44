"""The cluster's front: the HTTP server clients connect to, with the router inside it (no Ray here).

`python -m service.cluster` serves the router itself, in uvicorn, and reaches the model groups'
replicas by DeploymentHandle: one process hop per request, and the process holding the client's
connection is the one that retries when a replica dies, so a dead replica is a retry or a 503,
never a dropped connection or a 500. It drains as `python -m service` does: on SIGTERM it
stops accepting, lets the requests in flight finish within `shutdown_grace_s`, then answers what
is still running with the same JSON 503 and `Retry-After`.

Every answer carries one `X-Request-ID`: the app's (which is the client's when valid, as the
front forwards it), or the front's own for answers it gives itself.
"""

from __future__ import annotations

import math

import uvicorn
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.headers import EveryAnswerHeadersMiddleware
from service.api.request_ids import REQUEST_ID_HEADER, request_id
from service.api.shutdown import AnswerWhenCutMiddleware, GracefulServer, ShutdownNotice
from service.main import ENVELOPES

CUT_MARGIN_S = 2  # uvicorn's own cancel, a backstop after the notice has answered what was still running


class RequestIdMiddleware:
    """Gives each request its id (the client's when valid, else a new one) before the router reads it, so the
    replica's app logs and answers with the same id; adds it to answers that lack one (the front's own).

    `answer_header=False` (behind Serve's proxy, which adds its own header with the same id) takes it off
    answers instead, so there is one.
    """

    def __init__(self, app: ASGIApp, answer_header: bool = True) -> None:
        self.app = app
        self.answer_header = answer_header

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = [(bytes(k).lower(), bytes(v)) for k, v in scope.get("headers", [])]
        rid = request_id(headers)
        others = [h for h in headers if h[0] != b"x-request-id"]
        scope = {**scope, "headers": [*others, (b"x-request-id", rid.encode())]}

        async def answer_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": list(message.get("headers", []))}
                answer = MutableHeaders(scope=message)
                if not self.answer_header:
                    del answer[REQUEST_ID_HEADER]
                elif REQUEST_ID_HEADER not in answer:
                    answer[REQUEST_ID_HEADER] = rid
            await send(message)

        await self.app(scope, receive, answer_with_id)


def front_app(router: ASGIApp, notice: ShutdownNotice) -> ASGIApp:
    """The router with what every answer of one process has: a request id, nosniff, the shutdown cut's 503 (in the
    envelope of the protocol that owns the path, as one process answers it)."""
    cut = AnswerWhenCutMiddleware(router, notice, envelopes=ENVELOPES)
    return EveryAnswerHeadersMiddleware(RequestIdMiddleware(cut))


def serve_front(app: ASGIApp, notice: ShutdownNotice, *, host: str, port: int, grace_s: float, log_level: str) -> bool:
    """Serve until SIGTERM or SIGINT, then drain: stop accepting, finish in-flight requests, 503 past the grace.

    False when it could not start (its port taken, or the app's startup failed)."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        log_config=None,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=math.ceil(grace_s) + CUT_MARGIN_S,
    )
    server = GracefulServer(config, notice, grace_s)
    try:
        server.run()
    except SystemExit:  # uvicorn exits when it cannot bind its port or the app's startup fails
        return False
    return bool(server.started)
