"""An Open Inference Protocol infer request into a model batch, and named outputs into the answer's bytes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
import torch
from pydantic import ValidationError

from service.codecs.oip import Datatype, decode_tensor, decompress, encode_response, encode_tensor, split_body
from service.config import Settings
from service.errors import BadInput, InvalidField, TooLarge
from service.registry.loaded import LoadedModel
from service.runtime.oip import (
    INPUT_NAME,
    OutputRequest,
    as_array,
    classify,
    image_batch,
    is_model_output,
    tensor_batch,
)
from service.schemas.v2 import InferInputTensor, InferRequest, InferRequestedOutput

_SHARED_MEMORY = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")


@dataclass
class DecodedInfer:
    id: str | None
    batch: torch.Tensor
    outputs: list[OutputRequest] | None  # None: every model output, binary as `default_binary`
    default_binary: bool


def decode_body(
    body: bytes, content_encoding: str | None, header_length: str | None, model: LoadedModel, settings: Settings
) -> DecodedInfer:
    """The whole request body (maybe gzip/deflate, maybe JSON + binary tensors) into a batch and output requests."""
    header, binary = split_body(decompress(body, content_encoding, settings.max_body_bytes), header_length)
    return decode_infer(header, binary, model, settings)


def decode_infer(header: bytes, binary: bytes, model: LoadedModel, settings: Settings) -> DecodedInfer:
    """Parse and check the JSON header, cut the binary tensors out of `binary`, build the batch."""
    try:
        data = orjson.loads(header)
    except orjson.JSONDecodeError:
        raise BadInput("the inference request header is not valid JSON") from None
    try:
        request = InferRequest.model_validate(data)
    except ValidationError as exc:
        problems = (f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors(include_url=False))
        raise InvalidField("invalid inference request: " + "; ".join(problems)) from None
    if len(request.inputs) != 1:
        names = [t.name for t in request.inputs]
        raise InvalidField(f"{model.name} takes one input, {INPUT_NAME!r}; got {names}")
    tensor = request.inputs[0]
    if tensor.name != INPUT_NAME:
        raise InvalidField(f"unknown input {tensor.name!r}; {model.name} takes {INPUT_NAME!r}")
    raw, rest = _binary_part(tensor, binary)
    if rest:
        raise BadInput(f"{len(rest)} bytes after the JSON header that no input's binary_data_size claims")
    array = decode_tensor(tensor.name, tensor.shape, tensor.datatype, tensor.data, raw)
    if tensor.datatype is Datatype.BYTES:
        batch = image_batch(array, model, settings.max_inputs, settings.max_image_pixels)
    else:
        batch = tensor_batch(array, tensor.datatype, model, settings.max_inputs)
    params = request.parameters or {}
    default_binary = _flag(params, "binary_data_output", "parameters")
    outputs = None
    if request.outputs:  # absent or empty: every model output
        outputs = [_output_request(o, default_binary) for o in request.outputs]
        names = [o.name for o in outputs]
        if len(set(names)) != len(names):
            raise InvalidField(f"an output is requested twice: {names}")
        if len(names) > settings.max_layers:
            raise InvalidField(f"{len(names)} outputs requested, over the limit of {settings.max_layers} (max_layers)")
    return DecodedInfer(request.id, batch, outputs, default_binary)


def _binary_part(tensor: InferInputTensor, binary: bytes) -> tuple[bytes | None, bytes]:
    params = tensor.parameters or {}
    if any(key in params for key in _SHARED_MEMORY):
        raise BadInput("shared memory tensors are not supported; send the data in the body")
    size = params.get("binary_data_size")
    if size is None:
        return None, binary
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise InvalidField(f"{tensor.name}: binary_data_size must be a non-negative integer")
    if tensor.data is not None:
        raise InvalidField(f"{tensor.name}: give 'data' or binary_data_size, not both")
    if size > len(binary):
        raise BadInput(f"{tensor.name}: binary_data_size is {size} but only {len(binary)} bytes follow the JSON")
    return binary[:size], binary[size:]


def _flag(params: Mapping[str, Any], key: str, where: str) -> bool:
    value = params.get(key, False)
    if not isinstance(value, bool):
        raise InvalidField(f"{where}.{key} must be true or false")
    return value


def _output_request(output: InferRequestedOutput, default_binary: bool) -> OutputRequest:
    params = output.parameters or {}
    if any(key in params for key in _SHARED_MEMORY):
        raise BadInput("shared memory outputs are not supported")
    binary = _flag(params, "binary_data", output.name) if "binary_data" in params else default_binary
    k = params.get("classification", 0)
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        raise InvalidField(f"{output.name}.classification must be a non-negative integer (the k of top-k)")
    return OutputRequest(output.name, binary, k)


def encode_infer(
    model: LoadedModel,
    decoded: DecodedInfer,
    tensors: Mapping[str, torch.Tensor],
    settings: Settings,
) -> tuple[bytes, int | None]:
    """The answer: JSON header (`model_name`, `model_version`, `id`, `outputs`) and binary outputs after it."""
    requests = decoded.outputs
    if requests is None:
        requests = [OutputRequest(name, decoded.default_binary) for name in tensors]
    entries: list[dict[str, Any]] = []
    chunks: list[bytes] = []
    json_elements = binary_bytes = 0
    for req in requests:
        tensor = tensors[req.name]
        if req.classification:
            label = model.label if is_model_output(req.name) else str
            datatype, array = Datatype.BYTES, classify(tensor, req.classification, label)
        else:
            datatype, array = as_array(tensor)
        if not req.binary:
            json_elements += array.size
        elif datatype is not Datatype.BYTES:
            _check_sizes(json_elements, binary_bytes + array.nbytes, settings)
        _check_sizes(json_elements, binary_bytes, settings)
        entry, raw = encode_tensor(req.name, datatype, array, req.binary)
        entries.append(entry)
        if raw is not None:
            chunks.append(raw)
            binary_bytes += len(raw)
            _check_sizes(json_elements, binary_bytes, settings)
    header: dict[str, Any] = {"model_name": model.name, "model_version": "1"}
    if decoded.id is not None:
        header["id"] = decoded.id
    header["outputs"] = entries
    body, header_length = encode_response(header, chunks)
    json_size = len(body) if header_length is None else header_length
    if json_size > settings.max_json_response_bytes:
        raise TooLarge(_too_big("JSON", json_size, settings.max_json_response_bytes, "max_json_response_bytes"))
    return body, header_length


def _check_sizes(json_elements: int, binary_bytes: int, settings: Settings) -> None:
    if 2 * json_elements > settings.max_json_response_bytes:
        raise TooLarge(_too_big("JSON", 2 * json_elements, settings.max_json_response_bytes, "max_json_response_bytes"))
    if binary_bytes > settings.max_binary_response_bytes:
        raise TooLarge(
            _too_big("binary", binary_bytes, settings.max_binary_response_bytes, "max_binary_response_bytes")
        )


def _too_big(kind: str, size: int, limit: int, setting: str) -> str:
    return (
        f"the {kind} part of the answer would be at least {size} bytes, over the {limit}-byte limit ({setting}); "
        "ask for binary_data outputs, fewer outputs or fewer samples"
    )
