"""The app in the test process: behind a real uvicorn on a free loopback port, or on the test's own event loop
through httpx's ASGI transport (lifespan running, models loaded)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx
import uvicorn
from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.config import Settings
from service.main import create_app
from service.runtime.executor import ModelExecutor
from tests.helpers.waiting import PATIENCE_S

T = TypeVar("T")


async def sent_while_held(executor: ModelExecutor, sends: Sequence[Awaitable[T]], queued: int | None = None) -> list[T]:
    """Await `sends` (requests to `executor`'s model) while the model is held by a job that needs it alone,
    released once `queued` of them (default: all) wait in its queue: batches then form from a full queue,
    whatever the event loop's timing (a free worker could start before the last request arrived)."""
    release = threading.Event()
    held = asyncio.ensure_future(executor.run_exclusive(lambda: release.wait(PATIENCE_S)))
    sent = asyncio.gather(*sends)
    deadline = time.monotonic() + PATIENCE_S
    try:
        while executor.queue_depth < (len(sends) if queued is None else queued):
            assert time.monotonic() < deadline, "the requests never all queued"
            await asyncio.sleep(0.005)
    finally:
        release.set()
    await held
    return list(await sent)


@asynccontextmanager
async def asgi_serving(
    model_dir: Path, files: dict[str, str], **settings: Any
) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    """Write `files` (models.toml and the model code) into `model_dir`, start the app's lifespan and yield it with
    a client on the same event loop once no model is loading. `settings` override Settings' defaults."""
    for name, text in files.items():
        (model_dir / name).write_text(text)
    settings = {"worker_threads": 2, "decode_threads": 2} | settings
    app = create_app(Settings(model_dir=model_dir, config=model_dir / "models.toml", **settings))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://hookserve", timeout=60) as client:
            deadline = time.monotonic() + PATIENCE_S
            while any(m["status"] == "loading" for m in (await client.get("/models")).json()["models"]):
                assert time.monotonic() < deadline, "models still loading"
                await asyncio.sleep(0.02)
            yield app, client


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


class ResponseMessages:
    """ASGI middleware that records the size of every `http.response.body` message the app sends, and whether
    it said more would follow."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.bodies: list[tuple[int, bool]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def recorded(message: Message) -> None:
            if message["type"] == "http.response.body":
                self.bodies.append((len(message.get("body", b"")), bool(message.get("more_body", False))))
            await send(message)

        await self.app(scope, receive, recorded if scope["type"] == "http" else send)
