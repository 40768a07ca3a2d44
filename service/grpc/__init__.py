"""The gRPC front: KServe v2 / Triton's `inference.GRPCInferenceService` over the same data plane as REST.

`service.py` holds the methods (each decodes its message, makes one data-plane call and encodes
the answer), `errors.py` the mapping of domain errors to gRPC status codes, `server.py` the
grpc.aio server the app's lifespan starts on `grpc_port` beside HTTP.
"""
