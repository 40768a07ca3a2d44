"""The fronts beside the HTTP app, each on its own port, started and stopped by the app's lifespan.

gRPC (`inference.GRPCInferenceService`, `grpc_port`) and the TorchServe-compatible management API
(`torchserve_management_port`) run on the same event loop as HTTP, over the same data plane; a
port set to None (`off`) serves none. The ports they got (useful with 0: a free port) are kept on
`app.state.ports`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

from fastapi import FastAPI

from service.api.deps import AppState
from service.api.metrics import metrics_of
from service.grpc.server import grpc_serving
from service.torchserve.server import management_serving


@asynccontextmanager
async def side_fronts(app: FastAPI, state: AppState) -> AsyncIterator[dict[str, int]]:
    """Serve the configured side fronts while inside; yields (and keeps on `app.state.ports`) their bound ports."""
    settings = state.settings
    ports: dict[str, int] = {}
    app.state.ports = ports
    metrics = metrics_of(app)

    def observe(method: str, model: str, status: int, seconds: float) -> None:
        metrics.observe_request(f"grpc:{method}", "GRPC", model, status, seconds)

    async with AsyncExitStack() as stack:
        if settings.grpc_port is not None:
            ports["grpc"] = await stack.enter_async_context(
                grpc_serving(state.plane, settings, settings.grpc_port, lambda: state.draining, observe)
            )
        if settings.torchserve_management_port is not None:
            port = settings.torchserve_management_port
            ports["torchserve_management"] = await stack.enter_async_context(
                management_serving(lambda: state.plane, settings, port)
            )
            stack.callback(state.plane.close_archives)  # the archives it extracted go when it stops
        yield ports
