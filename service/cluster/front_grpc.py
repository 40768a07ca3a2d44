"""The front's gRPC server: `inference.GRPCInferenceService` on `grpc_port`, routed to the groups by handle.

`python -m service.cluster` runs it beside the front's HTTP server, on the same event loop (the
handles' routers run there), with the message limits of a single server's gRPC front. Each call
is routed as under Serve's gRPC proxy (`service.cluster.grpc_ingress.route`): to the group that
serves the model, or to every group for the server-wide calls, merged; a replica answers it over
its own data plane with the codes and details a single server gives. It stops after HTTP has
drained, giving the calls in flight `shutdown_grace_s`, as one process does.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import grpc

from service.cluster.grpc_ingress import GrpcIngress
from service.cluster.router import Group
from service.config import Settings
from service.grpc.registration import add_to_server
from service.grpc.server import message_limits

log = logging.getLogger("hookserve.cluster")


class FrontServicer(GrpcIngress):
    """One method per RPC (grpc.aio calls them with the request and its context), each routed to a group."""

    def __init__(self, groups: Sequence[Group], handles: Mapping[str, Any]) -> None:
        self.groups = list(groups)
        self.handles = dict(handles)


class GrpcFront:
    """The grpc.aio server of the front: `start` on the front's loop at its startup, `stop` once HTTP has drained."""

    def __init__(self, servicer: FrontServicer, settings: Settings, port: int) -> None:
        self.servicer = servicer
        self.settings = settings
        self.port = port
        self._server: grpc.aio.Server | None = None

    async def start(self) -> int:
        server = grpc.aio.server(options=message_limits(self.settings))
        add_to_server(self.servicer, server)
        host = self.settings.host
        address = f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"
        bound = server.add_insecure_port(address)
        if bound == 0:
            raise OSError(f"cannot listen for gRPC on {address}")
        await server.start()
        self._server = server
        log.info("gRPC (inference.GRPCInferenceService) on %s:%d", host, bound)
        return bound

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(self.settings.shutdown_grace_s)
            self._server = None
