"""The front's gRPC server: `inference.GRPCInferenceService` on `grpc_port`, routed to the groups by handle.

`python -m service.cluster` runs it beside the front's HTTP server, on the same event loop (the
handles' routers run there), with the message limits of a single server's gRPC front. Each call
is routed as under Serve's gRPC proxy (`service.cluster.grpc_ingress.route`): to the group that
serves the model, or to every group for the server-wide calls, merged; a replica answers it over
its own data plane with the codes and details a single server gives. As over HTTP, a call whose
replica died under it is retried on another (`retries`), and a group with no replica running
answers UNAVAILABLE after `no_replica_wait_s` instead of holding the call. It stops after HTTP
has drained, giving the calls in flight `shutdown_grace_s`, as one process does.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc

from service.cluster.grpc_ingress import GrpcAnswer, GrpcIngress
from service.cluster.router import Group, GroupUnavailable, ReplicaLost
from service.config import Settings
from service.grpc.registration import add_to_server
from service.grpc.server import message_limits

log = logging.getLogger("hookserve.cluster")


Call = Callable[..., Awaitable[Any]]  # (group, replica method, *args) -> its answer; HandleSender.call


class FrontServicer(GrpcIngress):
    """One method per RPC (grpc.aio calls them with the request and its context), each routed to a group."""

    def __init__(self, groups: Sequence[Group], call: Call, retries: int) -> None:
        self.groups = list(groups)
        self.call = call
        self.retries = retries

    async def _send_grpc(self, group: str, method: str, request: bytes, authorization: str | None) -> GrpcAnswer:
        reason = "its replica stopped under the call"
        for _ in range(self.retries + 1):
            try:
                answer: GrpcAnswer = await self.call(group, "grpc", method, request, authorization)
            except ReplicaLost as exc:
                reason = f"its replica stopped under the call ({exc})"
                continue
            except GroupUnavailable as exc:
                reason = f"no replica can take the call now: {exc}"
                break
            return answer
        return GrpcAnswer("UNAVAILABLE", f"model group {group!r} could not answer: {reason}; retry", b"")


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
