"""The gRPC inference protocol's messages: `inference.proto` and the modules protoc generates from it.

`inference_pb2.py` and its typing stub `inference_pb2.pyi` are generated and committed, so that
installing hookserve needs only the protobuf runtime, never a protobuf compiler; regenerate them
with `python -m service.codecs.protos.generate` after editing the .proto.
"""
