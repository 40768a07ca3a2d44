"""gRPC in a cluster: Ray Serve's gRPC proxy calls the router by the RPC's name; the router forwards to a group.

`python -m service.cluster` starts Serve's gRPC proxy on `grpc_port` with hookserve's
`inference.GRPCInferenceService` (`service.grpc.service.add_to_server`). With one application, the
proxy needs no `application` metadata, so `tritonclient.grpc` works unchanged. The proxy hands each
call to the router deployment's method of the RPC's name (`GrpcIngress`), with the decoded message
and Serve's gRPC context; the router picks the group that serves the model (every group for the
server-wide calls) and replays the call there (`GrpcReplica.grpc`): the same `InferenceService` as
a single server, over that replica's data plane. Errors keep their status codes and details.

What a cluster cannot give over gRPC: the client's deadline (Serve's context does not carry it; the
replicas' `request_timeout_s` bounds every request instead), and loading or unloading through the
repository extension (the model set is the Serve config, as over HTTP: FAILED_PRECONDITION).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import Message

from service.cluster.router import MODEL_SET_IS_CONFIG, Group
from service.codecs.protos import inference_pb2 as pb
from service.config import Settings
from service.grpc.registration import METHODS
from service.grpc.service import InferenceService

SERVICER = "service.grpc.registration.add_to_server"  # what Serve's gRPC proxy registers, by import path
REFUSED = ("RepositoryModelLoad", "RepositoryModelUnload")


def grpc_options(settings: Settings) -> dict[str, Any] | None:
    """Serve's gRPC proxy options: on `grpc_port` (None: no gRPC proxy), serving hookserve's service."""
    if settings.grpc_port is None:
        return None
    return {"port": settings.grpc_port, "grpc_servicer_functions": [SERVICER]}


@dataclass(frozen=True)
class GrpcAnswer:
    """A replica's answer to one call: the status code's name, its details, and the serialized response."""

    code: str
    details: str
    response: bytes
    trailing: tuple[tuple[str, str], ...] = ()


class _Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str, trailing: Sequence[tuple[str, str]]) -> None:
        super().__init__(details)
        self.code, self.details, self.trailing = code, details, tuple(trailing)


class _Context:
    """What `InferenceService` asks of a gRPC context, for a call replayed inside a replica."""

    def __init__(self, authorization: str | None) -> None:
        self._metadata = (("authorization", authorization),) if authorization else ()

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def time_remaining(self) -> float | None:
        return None  # Serve's context carries no deadline: request_timeout_s bounds the request

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> None:
        raise _Aborted(code, details, trailing_metadata)


class GrpcReplica:
    """For `ModelGroup`: run one gRPC call on this replica's app, as a single server's gRPC front would."""

    host: Any  # service.cluster.asgi_host.AppHost, its app's lifespan running

    async def grpc(self, method: str, request: bytes, authorization: str | None) -> GrpcAnswer:
        state = self.host.app.state.hookserve
        service = InferenceService(state.plane, state.settings, lambda: state.draining)
        message = METHODS[method][0].FromString(request)
        try:
            answer: Message = await getattr(service, method)(message, _Context(authorization))
        except _Aborted as stop:
            return GrpcAnswer(stop.code.name, stop.details, b"", stop.trailing)
        return GrpcAnswer("OK", "", answer.SerializeToString())


Send = Callable[[str, str, bytes, str | None], Awaitable[GrpcAnswer]]  # (group, method, request, authorization)


def _target(method: str, request: Message) -> str | None:
    """The model a call is about (None: a server-wide call, or statistics of every model)."""
    for field in ("model_name", "name"):
        value = getattr(request, field, "")
        if isinstance(value, str) and value:
            return value
    return None


async def route(groups: Sequence[Group], send: Send, method: str, request: Message, grpc_context: Any) -> Message:
    """Answer one call from the groups; a failed call sets its code and details on Serve's context."""
    response_type = METHODS[method][1]
    if method in REFUSED:
        return _fail(grpc_context, "FAILED_PRECONDITION", MODEL_SET_IS_CONFIG, response_type)
    metadata = dict(grpc_context.invocation_metadata())
    authorization = metadata.get("authorization")
    raw = request.SerializeToString()
    model = _target(method, request)
    if model is not None:  # the group that serves it; an unknown model is the first group's to refuse
        owner = next((g.name for g in groups if model in g.models), groups[0].name)
        return _unwrap(await send(owner, method, raw, authorization), grpc_context, response_type)
    answers = [await send(g.name, method, raw, authorization) for g in groups]
    failed = next((a for a in answers if a.code != "OK"), None)
    if failed is not None:
        return _unwrap(failed, grpc_context, response_type)
    parts = [response_type.FromString(a.response) for a in answers]
    return _merge(method, parts)


def _unwrap(answer: GrpcAnswer, grpc_context: Any, response_type: type[Message]) -> Message:
    if answer.code != "OK":
        if answer.trailing:
            grpc_context.set_trailing_metadata(list(answer.trailing))
        return _fail(grpc_context, answer.code, answer.details, response_type)
    return response_type.FromString(answer.response)


def _fail(grpc_context: Any, code: str, details: str, response_type: type[Message]) -> Message:
    grpc_context.set_code(grpc.StatusCode[code])
    grpc_context.set_details(details)
    return response_type()


def _merge(method: str, parts: list[Message]) -> Message:
    """Server-wide answers of every group as one."""
    if method == "ServerLive":
        return pb.ServerLiveResponse(live=all(p.live for p in parts))  # type: ignore[attr-defined]
    if method == "ServerReady":
        return pb.ServerReadyResponse(ready=all(p.ready for p in parts))  # type: ignore[attr-defined]
    if method == "RepositoryIndex":
        merged = pb.RepositoryIndexResponse()
        rows = {row.name: row for part in parts for row in part.models}  # type: ignore[attr-defined]
        merged.models.extend(rows[name] for name in sorted(rows))
        return merged
    if method == "ModelStatistics":
        stats = pb.ModelStatisticsResponse()
        rows_by_name = {row.name: row for part in parts for row in part.model_stats}  # type: ignore[attr-defined]
        stats.model_stats.extend(rows_by_name[name] for name in sorted(rows_by_name))
        return stats
    return parts[0]  # ServerMetadata: every replica says the same


class GrpcIngress:
    """For `Router`: one method per RPC, as Ray Serve's gRPC proxy calls them (`grpc_context` passed by name)."""

    groups: list[Group]
    handles: dict[str, Any]  # group -> its deployment's handle

    async def _send_grpc(self, group: str, method: str, request: bytes, authorization: str | None) -> GrpcAnswer:
        try:
            answer: GrpcAnswer = await self.handles[group].grpc.remote(method, request, authorization)
        except Exception as exc:  # no replica could take it, or it died under the call
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            return GrpcAnswer("UNAVAILABLE", f"model group {group!r} could not answer: {reason}; retry", b"")
        return answer

    async def _route_grpc(self, method: str, request: Message, grpc_context: Any) -> Message:
        return await route(self.groups, self._send_grpc, method, request, grpc_context)


def _rpc(name: str) -> Callable[..., Awaitable[Message]]:
    async def call(self: GrpcIngress, request: Message, grpc_context: Any) -> Message:
        return await self._route_grpc(name, request, grpc_context)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"`inference.GRPCInferenceService/{name}`, routed to the groups."
    return call


for _name in METHODS:
    setattr(GrpcIngress, _name, _rpc(_name))
