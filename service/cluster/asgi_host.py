"""Run an ASGI application inside this process without a server: its lifespan, and one request at a time.

A model group's replica hosts `create_app(settings)` this way: startup builds the registry,
each forwarded request is replayed through the whole app (middleware, limits, error
handlers) exactly as uvicorn would drive it, and shutdown releases the models.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from starlette.types import ASGIApp, Message

from service.cluster.messages import ForwardRequest, ForwardResponse

ASGI = {"version": "3.0", "spec_version": "2.3"}
DISCONNECT_GRACE_S = 5.0  # how long a request whose caller gave up may take to drop its work
INTERNAL_ERROR = b"Internal Server Error"
log = logging.getLogger("hookserve.cluster")


class LifespanError(RuntimeError):
    """The app refused to start (lifespan.startup.failed) or stopped on its own."""


class AppHost:
    """One ASGI app with its lifespan running; `call()` answers requests in-process."""

    def __init__(self, app: ASGIApp, server: tuple[str, int] = ("127.0.0.1", 0)) -> None:
        self.app = app
        self.server = server
        self.state: dict[str, Any] = {}
        self._to_app: asyncio.Queue[Message] = asyncio.Queue()
        self._from_app: asyncio.Queue[Message] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self.error: str | None = None

    async def start(self) -> None:
        """Send lifespan.startup and wait for the app's answer."""
        scope = {"type": "lifespan", "asgi": ASGI, "state": self.state}
        self._task = asyncio.create_task(self._run_lifespan(scope))
        await self._to_app.put({"type": "lifespan.startup"})
        answer = await self._from_app.get()
        if answer["type"] != "lifespan.startup.complete":
            raise LifespanError(answer.get("message") or f"app startup failed ({answer['type']})")

    async def _run_lifespan(self, scope: dict[str, Any]) -> None:
        try:
            await self.app(scope, self._to_app.get, self._from_app.put)
        except Exception as exc:  # the waiter (start or stop) gets it as the app's answer
            self.error = f"{type(exc).__name__}: {exc}"
            await self._from_app.put({"type": "lifespan.startup.failed", "message": self.error})

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def stop(self, timeout: float = 60.0) -> None:
        """Send lifespan.shutdown and wait (at most `timeout` s) for the app to release everything."""
        if not self.running:
            return
        await self._to_app.put({"type": "lifespan.shutdown"})
        try:
            await asyncio.wait_for(self._from_app.get(), timeout)
        finally:
            if self._task is not None and not self._task.done():
                self._task.cancel()

    async def call(self, request: ForwardRequest) -> ForwardResponse:
        """Drive one HTTP request through the app and collect its whole answer."""
        scope = {
            "type": "http",
            "asgi": ASGI,
            "http_version": request.http_version,
            "method": request.method,
            "scheme": request.scheme,
            "path": request.path,
            "raw_path": request.path.encode("utf-8"),
            "query_string": request.query_string,
            "root_path": "",
            "headers": list(request.headers),
            "client": request.client,
            "server": self.server,
            "state": dict(self.state),
        }
        body_sent = False
        gone = asyncio.Event()  # set when the caller gave up (or the app is done): `receive` then says disconnect

        async def receive() -> Message:
            nonlocal body_sent
            if not body_sent:
                body_sent = True
                return {"type": "http.request", "body": request.body, "more_body": False}
            await gone.wait()  # after the body, only a disconnect can follow
            return {"type": "http.disconnect"}

        status = 500
        headers: list[tuple[bytes, bytes]] = []
        chunks: list[bytes] = []
        started = False

        async def send(message: Message) -> None:
            nonlocal status, headers, started
            if message["type"] == "http.response.start":
                started = True
                status = int(message["status"])
                headers = [(bytes(k), bytes(v)) for k, v in message.get("headers", [])]
            elif message["type"] == "http.response.body":
                chunks.append(bytes(message.get("body", b"")))

        task = asyncio.ensure_future(self.app(scope, receive, send))
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            # The caller gave up (its client left): the app sees a disconnect, as from a client over HTTP, and
            # drops the request's work; it gets a moment to do so before it is cancelled outright.
            gone.set()
            await asyncio.wait({task}, timeout=DISCONNECT_GRACE_S)
            task.cancel()
            raise
        except Exception:
            if not started:  # as uvicorn answers an app that raised before answering
                log.exception("the app raised before answering %s %s", request.method, request.path)
                return ForwardResponse(500, [(b"content-type", b"text/plain; charset=utf-8")], INTERNAL_ERROR)
            log.exception("the app raised after answering %s %s", request.method, request.path)
        finally:
            gone.set()
        return ForwardResponse(status, headers, b"".join(chunks))
