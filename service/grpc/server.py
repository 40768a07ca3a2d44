"""The grpc.aio server beside HTTP: on the app's event loop, so it shares the data plane, the fleet and the limits.

Messages are bounded like REST bodies: a request over `max_body_bytes` is refused by gRPC itself
(RESOURCE_EXHAUSTED) before it is decoded, and an answer over `max_binary_response_bytes` is a
413-like RESOURCE_EXHAUSTED from the data plane before it is built.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import grpc

from service.config import Settings
from service.dataplane.plane import DataPlane
from service.grpc.service import CallObserver, InferenceService, add_to_server

GRPC_MESSAGE_CAP = 2**31 - 1  # gRPC's own ceiling on a message's size
log = logging.getLogger("hookserve.grpc")


def message_limits(settings: Settings) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", min(settings.max_body_bytes, GRPC_MESSAGE_CAP)),
        ("grpc.max_send_message_length", min(settings.max_binary_response_bytes, GRPC_MESSAGE_CAP)),
    ]


@asynccontextmanager
async def grpc_serving(
    plane: DataPlane,
    settings: Settings,
    port: int,
    draining: Callable[[], bool] = lambda: False,
    observe: CallObserver | None = None,
) -> AsyncIterator[int]:
    """Serve `inference.GRPCInferenceService` on `settings.host:port` (0: a free port) while inside; yields the port.

    On exit, calls in flight get `shutdown_grace_s` to finish (HTTP has drained by then)."""
    server = grpc.aio.server(options=message_limits(settings))
    add_to_server(InferenceService(plane, settings, draining, observe), server)
    address = f"[{settings.host}]:{port}" if ":" in settings.host else f"{settings.host}:{port}"
    bound = server.add_insecure_port(address)
    if bound == 0:
        raise OSError(f"cannot listen for gRPC on {address}")
    await server.start()
    log.info("gRPC (inference.GRPCInferenceService) on %s:%d", settings.host, bound)
    try:
        yield bound
    finally:
        await server.stop(settings.shutdown_grace_s)
