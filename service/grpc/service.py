"""`inference.GRPCInferenceService`: health, metadata, inference, Triton's config and statistics, the repository.

Each method decodes its message, makes one data-plane call and encodes the answer, as REST's /v2
routes do over the same data plane (so batching, limits, admission and the layer-outputs extension
are the same). A domain error ends the call with its gRPC status code and the detail REST would
give; the call's deadline bounds the request, and a client that cancels abandons its job. The
repository's load and unload need the admin token as `authorization: Bearer <token>` metadata.

The methods are registered by hand (`add_to_server`), under the service name clients call, with
the generated message classes' (de)serializers: no generated servicer code is needed.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message

from service import __version__
from service.codecs.oip_grpc import GrpcInfer, parameter_value
from service.codecs.protos import inference_pb2 as pb
from service.codecs.triton_extensions import config_message, statistics_message
from service.config import Settings
from service.dataplane.admin import check_admin
from service.dataplane.oip import EXTENSIONS, PLATFORM, VERSIONS
from service.dataplane.plane import DataPlane
from service.errors import HookserveError, InvalidField, NotFound
from service.grpc.errors import detail_text, status_code, trailing_metadata
from service.grpc.registration import METHODS, SERVICE, add_to_server

__all__ = ["METHODS", "SERVICE", "InferenceService", "add_to_server"]

log = logging.getLogger("hookserve.grpc")

Req = TypeVar("Req", bound=Message)
Resp = TypeVar("Resp", bound=Message)
Context = grpc.aio.ServicerContext[Any, Any]
Method = Callable[[Any, Any, Context], Awaitable[Any]]
CallObserver = Callable[[str, str, int, float], None]  # (method, model, HTTP-like status, seconds)


def _model_of(request: Message) -> str:
    for field in ("model_name", "name"):
        value = getattr(request, field, "")
        if isinstance(value, str) and value:
            return value
    return ""


def _version(text: str) -> str | None:
    return text or None


def answered(method: Method) -> Method:
    """Domain errors become the call's status (INTERNAL for anything unexpected, logged); every call is observed."""

    @functools.wraps(method)
    async def call(self: InferenceService, request: Any, context: Context) -> Any:
        began = time.perf_counter()
        status = 200
        try:
            return await method(self, request, context)
        except HookserveError as exc:
            status = exc.status
            await context.abort(status_code(exc.status), detail_text(exc.detail), trailing_metadata(exc))
        except asyncio.CancelledError:
            status = 499  # the client cancelled, or its deadline passed: nobody reads an answer
            raise
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            status = 500
            log.error("unhandled error in %s", method.__name__, exc_info=exc)
            await context.abort(grpc.StatusCode.INTERNAL, "internal server error; the server log has the details")
        finally:
            if self.observe is not None:
                self.observe(method.__name__, _model_of(request), status, time.perf_counter() - began)
        raise AssertionError("unreachable: context.abort raises")

    return call


@dataclass
class InferenceService:
    """The methods of `inference.GRPCInferenceService` over `plane`."""

    plane: DataPlane
    settings: Settings
    draining: Callable[[], bool] = lambda: False
    observe: CallObserver | None = None

    @answered
    async def ServerLive(self, request: pb.ServerLiveRequest, context: Context) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    @answered
    async def ServerReady(self, request: pb.ServerReadyRequest, context: Context) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=not self.draining() and self.plane.not_ready() is None)

    @answered
    async def ModelReady(self, request: pb.ModelReadyRequest, context: Context) -> pb.ModelReadyResponse:
        """An unknown model or version is not ready (Triton answers so, where REST's /ready is a 404)."""
        try:
            why = self.plane.model_not_ready(request.name, _version(request.version))
        except NotFound:
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=why is None)

    @answered
    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Context) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name="hookserve", version=__version__, extensions=EXTENSIONS)

    @answered
    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Context) -> pb.ModelMetadataResponse:
        found = await self.plane.model_metadata(request.name, _version(request.version))
        answer = pb.ModelMetadataResponse(name=found.name, versions=VERSIONS, platform=PLATFORM)
        for target, tensors in ((answer.inputs, found.inputs), (answer.outputs, found.outputs)):
            for t in tensors:
                target.add(name=t.name, datatype=t.datatype.value, shape=t.shape)
        return answer

    @answered
    async def ModelInfer(self, request: pb.ModelInferRequest, context: Context) -> pb.ModelInferResponse:
        codec = GrpcInfer(request)
        answer: pb.ModelInferResponse = await self.plane.infer(
            request.model_name, _version(request.model_version), codec, timeout_s=context.time_remaining()
        )
        return answer

    @answered
    async def ModelConfig(self, request: pb.ModelConfigRequest, context: Context) -> pb.ModelConfigResponse:
        info = await self.plane.model_config(request.name, _version(request.version))
        return pb.ModelConfigResponse(config=config_message(info))

    @answered
    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context: Context) -> pb.ModelStatisticsResponse:
        found = self.plane.model_statistics(request.name or None, _version(request.version))
        return statistics_message([(s.name, s.version, s.statistics) for s in found])

    @answered
    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: Context) -> pb.RepositoryIndexResponse:
        answer = pb.RepositoryIndexResponse()
        for row in self.plane.repository_index(ready_only=request.ready):
            answer.models.add(name=row["name"], version=row["version"], state=str(row["state"]), reason=row["reason"])
        return answer

    @answered
    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: Context
    ) -> pb.RepositoryModelLoadResponse:
        self._admin(context)
        parameters = {key: _repository_value(key, value) for key, value in request.parameters.items()}
        await self.plane.repository_load(request.model_name, parameters)
        return pb.RepositoryModelLoadResponse()

    @answered
    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: Context
    ) -> pb.RepositoryModelUnloadResponse:
        self._admin(context)
        await self.plane.repository_unload(request.model_name)
        return pb.RepositoryModelUnloadResponse()

    def _admin(self, context: Context) -> None:
        metadata = dict(context.invocation_metadata() or ())
        authorization = metadata.get("authorization")
        check_admin(authorization if isinstance(authorization, str) else None, self.settings.admin_token)


def _repository_value(key: str, value: pb.ModelRepositoryParameter) -> Any:
    found = parameter_value(value)
    if isinstance(found, bytes):
        if key.startswith("file:"):
            return found  # refused by the data plane with the reason, as over REST
        raise InvalidField(f"parameters.{key}: bytes are only for file: parameters")
    return found
