"""Open Inference Protocol requests into model batches, and named output tensors into answers (no model runs here).

Inputs: one tensor `input__0`, numbers (`[N, *input_size]`) or BYTES holding encoded images
(preprocessed like /predict's). Outputs are `output__0`, `output__1`, ... (the model's output
tensors in order) or layer capture keys (our extension), JSON or binary, or top-k strings
with the classification extension.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import torch
from pydantic import ValidationError

from service.codecs.images import image_to_tensor
from service.codecs.oip import (
    bf16_bits_to_float32,
    decode_tensor,
    decompress,
    encode_response,
    encode_tensor,
    split_body,
)
from service.codecs.preprocess import DEFAULT_MAX_PREPROCESSED_PIXELS
from service.config import Settings
from service.dtypes import BY_TORCH
from service.errors import BadInput, InvalidField, TooLarge
from service.registry.loaded import LoadedModel
from service.schemas.v2 import InferInputTensor, InferRequest, InferRequestedOutput
from service.specs.vocab import Datatype

INPUT_NAME = "input__0"
OUTPUT_PREFIX = "output__"
OUTPUT_NAME = re.compile(r"^output__(\d+)$")


@dataclass(frozen=True)
class TensorInfo:
    """A model input or output as metadata lists it; -1 is the batch dimension."""

    name: str
    datatype: Datatype
    shape: list[int]


@dataclass(frozen=True)
class OutputRequest:
    name: str
    binary: bool = False
    classification: int = 0  # top-k strings instead of the tensor; 0 = off


def is_model_output(name: str) -> bool:
    return OUTPUT_NAME.match(name) is not None


def datatype_of(dtype: torch.dtype) -> Datatype:
    info = BY_TORCH.get(dtype)
    if info is None or info.oip is None:
        raise InvalidField(f"tensors of dtype {dtype} have no Open Inference Protocol datatype")
    return Datatype(info.oip)


def flatten_outputs(output: Any) -> list[torch.Tensor]:
    """The model's output tensors in order: a tensor, or the tensors of a (nested) tuple, list or dict."""
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, Mapping):
        return [t for v in output.values() for t in flatten_outputs(v)]
    if isinstance(output, (list, tuple)):
        return [t for v in output for t in flatten_outputs(v)]
    return []


def tensor_batch(array: np.ndarray[Any, Any], datatype: Datatype, model: LoadedModel, max_inputs: int) -> torch.Tensor:
    """A numeric input as the model's batch: rank and channels checked, other sizes fed as they are."""
    expected = [-1, *model.input_size]
    shape = list(array.shape)
    if len(shape) != len(expected) or shape[1] != expected[1]:
        raise InvalidField(f"{INPUT_NAME} has shape {shape}; {model.name} takes {expected} (N samples first)")
    _check_count(shape[0], max_inputs)
    if datatype is Datatype.BF16:
        array = bf16_bits_to_float32(array)
    if array.dtype.kind in "fc":
        tensor = torch.from_numpy(np.ascontiguousarray(array))
        if not bool(torch.isfinite(tensor).all()):
            raise InvalidField(f"{INPUT_NAME} holds NaN or infinite values")
        return tensor.to(torch.bfloat16) if datatype is Datatype.BF16 else tensor
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))


def image_batch(
    array: np.ndarray[Any, Any],
    model: LoadedModel,
    max_inputs: int,
    max_pixels: int,
    max_preprocessed: int = DEFAULT_MAX_PREPROCESSED_PIXELS,
) -> torch.Tensor:
    """A BYTES input of shape [N] or [N, 1]: N encoded images, preprocessed like /predict's (and bounded alike)."""
    if array.ndim not in (1, 2) or (array.ndim == 2 and array.shape[1] != 1):
        raise InvalidField(f"BYTES {INPUT_NAME} holds encoded images: shape [N] or [N, 1], not {list(array.shape)}")
    _check_count(array.shape[0], max_inputs)
    samples = [
        image_to_tensor(
            bytes(data),
            model.preprocess,
            model.channels,
            max_pixels,
            f"{INPUT_NAME}[{i}]",
            max_preprocessed=max_preprocessed,
        )
        for i, data in enumerate(array.reshape(-1))
    ]
    shapes = {tuple(s.shape) for s in samples}
    if len(shapes) > 1:
        raise InvalidField(f"images preprocess to different shapes {sorted(shapes)}; send one request per shape")
    return torch.stack(samples)


def _check_count(n: int, max_inputs: int) -> None:
    if n < 1:
        raise InvalidField(f"{INPUT_NAME} has no samples (batch dimension 0)")
    if n > max_inputs:
        raise TooLarge(f"{n} samples, over the limit of {max_inputs} per request (max_inputs)")


def classify(scores: torch.Tensor, k: int, label: Callable[[int], str]) -> np.ndarray[Any, Any]:
    """Triton's classification extension: per sample, the top-k values as "<value>:<index>:<label>" BYTES.

    Values are printed like C++ `std::to_string` (`%f`), highest first (ties: lower index first).
    """
    if scores.ndim == 0:
        raise InvalidField("classification needs a batch of scores, not a scalar output")
    flat = scores.detach().reshape(scores.shape[0], -1).to(torch.float64)
    k = min(k, flat.shape[1])
    values, indices = torch.sort(flat, dim=1, descending=True, stable=True)
    rows = [
        [f"{v:f}:{i}:{label(i)}".encode() for v, i in zip(vs[:k], idx[:k], strict=True)]
        for vs, idx in zip(values.tolist(), indices.tolist(), strict=True)
    ]
    out = np.empty((flat.shape[0], k), dtype=object)
    for r, row in enumerate(rows):
        out[r, :] = row
    return out


def as_array(tensor: torch.Tensor) -> tuple[Datatype, np.ndarray[Any, Any]]:
    """A CPU tensor as (datatype, array); BF16 as its bit patterns."""
    datatype = datatype_of(tensor.dtype)
    t = tensor.detach().cpu().contiguous()
    if datatype is Datatype.BF16:
        return datatype, t.view(torch.int16).numpy().view(np.uint16)
    return datatype, t.numpy()


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
    check_inputs([t.name for t in request.inputs], model)
    tensor = request.inputs[0]
    raw, rest = _binary_part(tensor, binary)
    if rest:
        raise BadInput(f"{len(rest)} bytes after the JSON header that no input's binary_data_size claims")
    array = decode_tensor(tensor.name, tensor.shape, tensor.datatype, tensor.data, raw)
    batch = model_batch(tensor.datatype, array, model, settings)
    params = request.parameters or {}
    default_binary = _flag(params, "binary_data_output", "parameters")
    outputs = None
    if request.outputs:  # absent or empty: every model output
        outputs = check_outputs([_output_request(o, default_binary) for o in request.outputs], settings)
    return DecodedInfer(request.id, batch, outputs, default_binary)


def check_inputs(names: Sequence[str], model: LoadedModel) -> None:
    """The request names exactly the model's one input (before any data is decoded)."""
    if len(names) != 1:
        raise InvalidField(f"{model.name} takes one input, {INPUT_NAME!r}; got {list(names)}")
    if names[0] != INPUT_NAME:
        raise InvalidField(f"unknown input {names[0]!r}; {model.name} takes {INPUT_NAME!r}")


def model_batch(
    datatype: Datatype, array: np.ndarray[Any, Any], model: LoadedModel, settings: Settings
) -> torch.Tensor:
    """The input's array as the model's batch: encoded images (BYTES) or numbers."""
    if datatype is Datatype.BYTES:
        return image_batch(
            array, model, settings.max_inputs, settings.max_image_pixels, settings.max_preprocessed_pixels
        )
    return tensor_batch(array, datatype, model, settings.max_inputs)


def check_outputs(outputs: list[OutputRequest], settings: Settings) -> list[OutputRequest]:
    names = [o.name for o in outputs]
    if len(set(names)) != len(names):
        raise InvalidField(f"an output is requested twice: {names}")
    if len(names) > settings.max_layers:
        raise InvalidField(f"{len(names)} outputs requested, over the limit of {settings.max_layers} (max_layers)")
    return outputs


def classification_k(value: Any, name: str) -> int:
    """The k of a `classification` parameter (0: off)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidField(f"{name}.classification must be a non-negative integer (the k of top-k)")
    return value


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
    return OutputRequest(output.name, binary, classification_k(params.get("classification", 0), output.name))


def answer_arrays(
    model: LoadedModel, decoded: DecodedInfer, tensors: Mapping[str, torch.Tensor]
) -> Iterator[tuple[OutputRequest, Datatype, np.ndarray[Any, Any]]]:
    """Each requested output (every model output when none is named) as (request, datatype, array), in order;
    top-k strings for a `classification` request."""
    requests = decoded.outputs
    if requests is None:
        requests = [OutputRequest(name, decoded.default_binary) for name in tensors]
    for req in requests:
        tensor = tensors[req.name]
        if req.classification:
            label = model.label if is_model_output(req.name) else str
            yield req, Datatype.BYTES, classify(tensor, req.classification, label)
        else:
            yield req, *as_array(tensor)


def encode_infer(
    model: LoadedModel,
    decoded: DecodedInfer,
    tensors: Mapping[str, torch.Tensor],
    settings: Settings,
) -> tuple[bytes, int | None]:
    """The answer: JSON header (`model_name`, `model_version`, `id`, `outputs`) and binary outputs after it."""
    entries: list[dict[str, Any]] = []
    chunks: list[bytes] = []
    json_elements = binary_bytes = 0
    for req, datatype, array in answer_arrays(model, decoded, tensors):
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


def check_answer_size(
    decoded: DecodedInfer, expected: Mapping[str, tuple[tuple[int, ...], int]], settings: Settings
) -> None:
    """The answer limits checked before the forward, as `encode_infer` checks them after it: `expected` gives each
    output's shape (the whole batch's) and item size, as far as the model's layer shapes tell (a name not in it is
    checked only when encoded)."""
    requests = decoded.outputs
    if requests is None:
        requests = [OutputRequest(name, decoded.default_binary) for name in expected if is_model_output(name)]
    json_elements = binary_bytes = 0
    for req in requests:
        found = expected.get(req.name)
        if found is None:
            continue
        shape, itemsize = found
        numel = math.prod(shape)
        if req.classification:  # k strings for each row of the last dimension
            json_elements += (
                numel // max(1, shape[-1] if shape else 1) * min(req.classification, shape[-1] if shape else 1)
            )
        elif req.binary:
            binary_bytes += numel * itemsize
        else:
            json_elements += numel
    _check_sizes(json_elements, binary_bytes, settings)


def check_binary_size(size: int, settings: Settings, what: str = "binary") -> None:
    """A binary answer's bytes within `max_binary_response_bytes` (413 over it, before it is built)."""
    if size > settings.max_binary_response_bytes:
        raise TooLarge(_too_big(what, size, settings.max_binary_response_bytes, "max_binary_response_bytes"))


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
