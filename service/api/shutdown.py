"""Shutdown past the grace period: requests still in flight are answered with a JSON 503 and `Retry-After`.

After SIGTERM the server stops accepting and waits up to `shutdown_grace_s` for in-flight
requests. When that passes, the server calls `ShutdownNotice.cut()`: every request still inside
the app whose answer has not started is cancelled (its job abandoned) and answered 503, in the
error envelope of its path, so a client can tell "come back later" from a server fault.
"""

from __future__ import annotations

import asyncio
import logging
import socket

import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.asgi_errors import Envelopes, error_body, send_error

RETRY_AFTER_S = 5
log = logging.getLogger("hookserve")
CUT_DETAIL = "the server is shutting down and this request did not finish within its grace period; retry shortly"


class ShutdownNotice:
    """The requests in flight, and whether the grace period has passed."""

    def __init__(self) -> None:
        self.cut_off = False
        self._in_flight: set[asyncio.Task[object]] = set()

    def cut(self) -> int:
        """Cancel every request still in flight; how many there were."""
        self.cut_off = True
        tasks = list(self._in_flight)
        for task in tasks:
            task.cancel()
        return len(tasks)

    def enter(self, task: asyncio.Task[object]) -> None:
        self._in_flight.add(task)

    def leave(self, task: asyncio.Task[object]) -> None:
        self._in_flight.discard(task)


class AnswerWhenCutMiddleware:
    """A request the notice cuts before its answer began gets a 503 instead of a dropped connection."""

    def __init__(self, app: ASGIApp, notice: ShutdownNotice, envelopes: Envelopes | None = None) -> None:
        self.app = app
        self.notice = notice
        self.envelopes = dict(envelopes or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        if scope["type"] != "http" or task is None:
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        self.notice.enter(task)
        try:
            await self.app(scope, receive, tracking_send)
        except asyncio.CancelledError:
            if not self.notice.cut_off or started:
                raise
            task.uncancel()  # the cancellation was ours: answer instead of dying
            body = error_body(self.envelopes, scope.get("path", ""), CUT_DETAIL, 503)
            headers = [(b"retry-after", str(RETRY_AFTER_S).encode()), (b"connection", b"close")]
            await send_error(send, 503, body, headers)
        finally:
            self.notice.leave(task)


class GracefulServer(uvicorn.Server):
    """uvicorn's server; when `grace_s` has passed since shutdown began, what is still running is answered 503."""

    def __init__(self, config: uvicorn.Config, notice: ShutdownNotice, grace_s: float) -> None:
        super().__init__(config)
        self.notice = notice
        self.grace_s = grace_s

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        timer = asyncio.get_running_loop().call_later(self.grace_s, self._cut)
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()

    def _cut(self) -> None:
        cut = self.notice.cut()
        if cut:
            log.warning(
                "shutdown grace period (%g s) over: answered %d request(s) still running with 503", self.grace_s, cut
            )
