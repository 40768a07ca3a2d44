"""The service's name and methods, and `add_to_server`: light enough for Ray Serve's gRPC proxy to import.

The methods are registered by hand under the name clients call, with the generated message
classes' (de)serializers: no generated servicer code is needed. Shaped like protoc's
`add_<Service>Servicer_to_server`, which is what Ray Serve's gRPC proxy takes by import path.
"""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf.message import Message

from service.codecs.protos import inference_pb2 as pb

SERVICE = "inference.GRPCInferenceService"

METHODS: dict[str, tuple[type[Message], type[Message]]] = {
    "ServerLive": (pb.ServerLiveRequest, pb.ServerLiveResponse),
    "ServerReady": (pb.ServerReadyRequest, pb.ServerReadyResponse),
    "ModelReady": (pb.ModelReadyRequest, pb.ModelReadyResponse),
    "ServerMetadata": (pb.ServerMetadataRequest, pb.ServerMetadataResponse),
    "ModelMetadata": (pb.ModelMetadataRequest, pb.ModelMetadataResponse),
    "ModelInfer": (pb.ModelInferRequest, pb.ModelInferResponse),
    "ModelConfig": (pb.ModelConfigRequest, pb.ModelConfigResponse),
    "ModelStatistics": (pb.ModelStatisticsRequest, pb.ModelStatisticsResponse),
    "RepositoryIndex": (pb.RepositoryIndexRequest, pb.RepositoryIndexResponse),
    "RepositoryModelLoad": (pb.RepositoryModelLoadRequest, pb.RepositoryModelLoadResponse),
    "RepositoryModelUnload": (pb.RepositoryModelUnloadRequest, pb.RepositoryModelUnloadResponse),
}


def add_to_server(servicer: Any, server: grpc.Server | grpc.aio.Server) -> None:
    """Register `servicer`'s methods (named as in `METHODS`) as `inference.GRPCInferenceService` on `server`."""
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(
            getattr(servicer, name),
            request_deserializer=request.FromString,
            response_serializer=response.SerializeToString,
        )
        for name, (request, response) in METHODS.items()
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
