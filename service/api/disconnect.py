"""A client that goes away takes its request with it: the handler is cancelled, so its job is abandoned.

Once a request's body has arrived, the server's next message on `receive` is the client's
disconnect (or, after the answer, the end of the exchange). For the paths that run a model,
this pure ASGI middleware watches for it and cancels the request's handler; the executor then
drops the job if it is queued, or stops its batch at the next forward if nobody else waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("hookserve.api")


class CancelOnDisconnectMiddleware:
    def __init__(self, app: ASGIApp, watched: Callable[[str], bool]) -> None:
        """`watched(path)`: whether requests to `path` run a model (and so are worth cancelling)."""
        self.app = app
        self.watched = watched

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watched = scope.get("method") in ("POST", "PUT") and self.watched(scope.get("path", ""))  # curl -T sends PUT
        if scope["type"] != "http" or not watched:
            await self.app(scope, receive, send)
            return
        body_read = asyncio.Event()
        answered = False

        async def tracked_receive() -> Message:
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_read.set()
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal answered
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                answered = True
            await send(message)

        handler = asyncio.ensure_future(self.app(scope, tracked_receive, tracked_send))
        watcher = asyncio.ensure_future(_cancel_on_disconnect(body_read, receive, handler, lambda: answered))
        try:
            await handler
        except asyncio.CancelledError:
            if not watcher.done() or not watcher.result():
                raise  # cancelled from outside (server shutdown), not by the client leaving
            log.info("client left during %s %s: its work was dropped", scope.get("method"), scope.get("path"))
            await _closed(send)
        finally:
            watcher.cancel()


async def _closed(send: Send) -> None:
    """Answer 499 (nginx's "client closed request") to nobody, so the access log and metrics say what happened."""
    body = b'{"detail":"client closed the connection before the answer"}'
    with contextlib.suppress(Exception):  # the connection is gone; the server may refuse to send
        await send({"type": "http.response.start", "status": 499, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})


async def _cancel_on_disconnect(
    body_read: asyncio.Event, receive: Callable[[], Awaitable[Message]], handler: asyncio.Future[None],
    answered: Callable[[], bool],
) -> bool:  # fmt: skip
    """Wait for the client's disconnect after the body; cancel the handler unless it already answered."""
    await body_read.wait()
    message = await receive()
    if message["type"] == "http.disconnect" and not answered() and not handler.done():
        handler.cancel()
        return True
    return False
