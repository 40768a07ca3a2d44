"""The Open Inference Protocol over gRPC: `ModelInferRequest` into a model batch, named tensors into a
`ModelInferResponse` (no model runs here, and no gRPC: only its messages).

A request's input arrives as raw little-endian bytes (`raw_input_contents`, what tritonclient
sends) or as typed `contents`; BYTES elements are encoded images, as over REST. Every output is
answered as raw bytes (`raw_output_contents`, what Triton answers); `classification` on an output
gives its top-k as "<value>:<index>:<label>" BYTES, and any other requested name is a layer (our
extension), exactly as REST's /v2 does: both fronts share `service.codecs.oip_infer`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from service.codecs.oip import decode_tensor, serialize_bytes, wire_dtype
from service.codecs.oip_infer import (
    DecodedInfer,
    OutputRequest,
    answer_arrays,
    check_binary_size,
    check_inputs,
    check_outputs,
    classification_k,
    model_batch,
)
from service.codecs.protos import inference_pb2 as pb
from service.config import Settings
from service.errors import BadInput, InvalidField
from service.registry.loaded import LoadedModel
from service.specs.vocab import Datatype

_SHARED_MEMORY = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")

# Which typed `contents` field holds each datatype (FP16 and BF16 travel only as raw bytes).
CONTENTS_FIELD: dict[Datatype, str] = {
    Datatype.BOOL: "bool_contents",
    Datatype.INT8: "int_contents",
    Datatype.INT16: "int_contents",
    Datatype.INT32: "int_contents",
    Datatype.INT64: "int64_contents",
    Datatype.UINT8: "uint_contents",
    Datatype.UINT16: "uint_contents",
    Datatype.UINT32: "uint_contents",
    Datatype.UINT64: "uint64_contents",
    Datatype.FP32: "fp32_contents",
    Datatype.FP64: "fp64_contents",
    Datatype.BYTES: "bytes_contents",
}


def parameter_value(param: pb.InferParameter | pb.ModelRepositoryParameter) -> Any:
    """The value a parameter holds (None when it holds none)."""
    which = param.WhichOneof("parameter_choice")
    return None if which is None else getattr(param, which)


def _datatype(text: str, where: str) -> Datatype:
    try:
        return Datatype(text)
    except ValueError:
        known = ", ".join(d.value for d in Datatype)
        raise InvalidField(f"{where}: unknown datatype {text!r}; one of {known}") from None


def _input_array(request: pb.ModelInferRequest, index: int) -> tuple[Datatype, np.ndarray[Any, Any]]:
    tensor = request.inputs[index]
    where = tensor.name
    if any(key in tensor.parameters for key in _SHARED_MEMORY):
        raise BadInput("shared memory tensors are not supported; send the data in the request")
    datatype = _datatype(tensor.datatype, where)
    shape = list(tensor.shape)
    if request.raw_input_contents:
        if len(request.raw_input_contents) != len(request.inputs):
            raise InvalidField(
                f"{len(request.raw_input_contents)} raw_input_contents for {len(request.inputs)} inputs; "
                "give one per input, or typed contents for all"
            )
        if tensor.HasField("contents"):
            raise InvalidField(f"{where}: give raw_input_contents or contents, not both")
        return datatype, decode_tensor(where, shape, datatype, None, request.raw_input_contents[index])
    field = CONTENTS_FIELD.get(datatype)
    if field is None:
        raise InvalidField(f"{where}: {datatype} data travels only as raw_input_contents")
    values = getattr(tensor.contents, field)
    if datatype is Datatype.BYTES:
        return datatype, decode_tensor(where, shape, datatype, None, serialize_bytes(list(values)))
    raw = np.asarray(values, dtype=wire_dtype(datatype)).tobytes()
    return datatype, decode_tensor(where, shape, datatype, None, raw)


def _output_request(output: pb.ModelInferRequest.InferRequestedOutputTensor) -> OutputRequest:
    if any(key in output.parameters for key in _SHARED_MEMORY):
        raise BadInput("shared memory outputs are not supported")
    k = 0
    if "classification" in output.parameters:
        k = classification_k(parameter_value(output.parameters["classification"]), output.name)
    return OutputRequest(output.name, True, k)


def decode_request(request: pb.ModelInferRequest, model: LoadedModel, settings: Settings) -> DecodedInfer:
    """The request's input as the model's batch, and the outputs it asks for (None: every model output)."""
    check_inputs([t.name for t in request.inputs], model)
    datatype, array = _input_array(request, 0)
    batch = model_batch(datatype, array, model, settings)
    outputs = check_outputs([_output_request(o) for o in request.outputs], settings) if request.outputs else None
    return DecodedInfer(request.id or None, batch, outputs, True)


def encode_response(
    model: LoadedModel, decoded: DecodedInfer, tensors: Mapping[str, torch.Tensor], settings: Settings
) -> pb.ModelInferResponse:
    """Every output as raw little-endian bytes (BYTES: 4-byte lengths, each followed by its bytes)."""
    answer = pb.ModelInferResponse(model_name=model.name, model_version="1", id=decoded.id or "")
    size = 0
    for req, datatype, array in answer_arrays(model, decoded, tensors):
        if datatype is Datatype.BYTES:
            raw = serialize_bytes([bytes(item) for item in array.reshape(-1)])
        else:
            check_binary_size(size + array.nbytes, settings)
            raw = np.ascontiguousarray(array, dtype=wire_dtype(datatype)).tobytes()
        size += len(raw)
        check_binary_size(size, settings)
        answer.outputs.add(name=req.name, datatype=datatype.value, shape=list(array.shape))
        answer.raw_output_contents.append(raw)
    return answer


class GrpcInfer:
    """gRPC's `ModelInfer`: the request arrived whole; the answer is a `ModelInferResponse`."""

    def __init__(self, request: pb.ModelInferRequest) -> None:
        self.request = request

    async def receive(self) -> None:
        """Nothing more to read: gRPC delivered the whole message."""

    def decode(self, model: LoadedModel, settings: Settings) -> DecodedInfer:
        return decode_request(self.request, model, settings)

    def encode(
        self, model: LoadedModel, decoded: DecodedInfer, tensors: Mapping[str, torch.Tensor], settings: Settings
    ) -> pb.ModelInferResponse:
        return encode_response(model, decoded, tensors, settings)
