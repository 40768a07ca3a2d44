"""An ASGI app behind a real uvicorn on a free loopback port, in a thread of the test process."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tests.helpers.waiting import PATIENCE_S


@contextmanager
def uvicorn_thread(app: ASGIApp) -> Iterator[str]:
    """Serve `app` (lifespan included) on 127.0.0.1; yields the base URL; stops it on exit."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + PATIENCE_S
        while not server.started:
            assert thread.is_alive(), "uvicorn stopped before it started"
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(PATIENCE_S)


class BodyMessages:
    """ASGI middleware that records the size of every `http.request` message the server delivers."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.sizes: list[int] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def counted() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                self.sizes.append(len(message.get("body", b"")))
            return message

        await self.app(scope, counted if scope["type"] == "http" else receive, send)
