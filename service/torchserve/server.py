"""The management API's own listener: a second uvicorn server on the app's event loop (no lifespan of its own:
the main app's lifespan owns the fleet and the data plane it serves)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import uvicorn

from service.config import Settings
from service.dataplane.plane import DataPlane
from service.torchserve.management import management_app

log = logging.getLogger("hookserve.torchserve")


@asynccontextmanager
async def management_serving(plane: Callable[[], DataPlane], settings: Settings, port: int) -> AsyncIterator[int]:
    """Serve the management API on `settings.host:port` (0: a free port) while inside; yields the port."""
    config = uvicorn.Config(
        management_app(plane),
        host=settings.host,
        port=port,
        lifespan="off",
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=max(1, round(settings.shutdown_grace_s)),
    )
    config.load()
    server = uvicorn.Server(config)
    server.lifespan = config.lifespan_class(config)
    await server.startup()
    if server.should_exit:  # startup could not bind: uvicorn logged why
        raise OSError(f"cannot listen for the TorchServe management API on {settings.host}:{port}")
    bound = int(server.servers[0].sockets[0].getsockname()[1])
    log.info("TorchServe-compatible management API on %s:%d", settings.host, bound)
    try:
        yield bound
    finally:
        await server.shutdown()
