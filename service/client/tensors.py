"""Tensors on the wire, client side: arrays in (base64 or JSON lists), arrays out (safetensors, npz, JSON).

Answers are read into NumPy arrays. NumPy has no bfloat16, so a bfloat16 tensor comes back
widened to float32 (exactly: bfloat16 is the top half of a float32). Torch tensors are
accepted as inputs without this module importing torch.
"""

from __future__ import annotations

import base64
import io
import json
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[Any]

# safetensors dtype codes -> NumPy dtypes (little-endian, as the format stores them)
_SAFETENSORS: dict[str, np.dtype[Any]] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
# NumPy dtypes the server takes as input tensors, by API name
INPUT_DTYPES: dict[str, str] = {
    "float32": "<f4",
    "float64": "<f8",
    "float16": "<f2",
    "int64": "<i8",
    "int32": "<i4",
    "int16": "<i2",
    "int8": "i1",
    "uint8": "u1",
    "bool": "?",
}


def bfloat16_to_float32(raw: Array) -> Array:
    """uint16 bit patterns of bfloat16 values -> float32 (shift into the high half)."""
    return (raw.astype(np.uint32) << 16).view(np.float32)


def read_safetensors(content: bytes) -> tuple[dict[str, Array], dict[str, str]]:
    """A safetensors file's tensors (writable arrays sharing one copy of the body) and its `__metadata__`."""
    if len(content) < 8:
        raise ValueError("not a safetensors file: shorter than its 8-byte header length")
    (length,) = struct.unpack("<Q", content[:8])
    if 8 + length > len(content):
        raise ValueError("not a safetensors file: header longer than the file")
    header: dict[str, Any] = json.loads(content[8 : 8 + length])
    metadata: dict[str, str] = header.pop("__metadata__", None) or {}
    buffer = bytearray(content[8 + length :])  # one copy, so the arrays are writable
    tensors: dict[str, Array] = {}
    for key, entry in header.items():
        start, end = entry["data_offsets"]
        shape = tuple(entry["shape"])
        code = entry["dtype"]
        if code == "BF16":
            raw = np.frombuffer(buffer, dtype="<u2", count=(end - start) // 2, offset=start)
            tensors[key] = bfloat16_to_float32(raw).reshape(shape)
            continue
        dtype = _SAFETENSORS.get(code)
        if dtype is None:
            raise ValueError(f"safetensors dtype {code!r} of {key!r} is not supported")
        count = (end - start) // dtype.itemsize
        tensors[key] = np.frombuffer(buffer, dtype=dtype, count=count, offset=start).reshape(shape)
    return tensors, metadata


_CODES = {dtype: code for code, dtype in _SAFETENSORS.items()}


def safetensors_bytes(tensors: Mapping[str, Array], metadata: Mapping[str, str]) -> bytes:
    """A safetensors file, byte for byte the same for the same input (keys sorted, metadata in order).

    The safetensors library serialises `__metadata__` from a hash map, so its key order (and
    the file) can change between runs; a resumable extraction needs reruns to write identical
    shards. Layout per the format: u64 header length, JSON header padded to 8 bytes, data.
    """
    header: dict[str, Any] = {"__metadata__": dict(metadata)}
    arrays = []
    offset = 0
    for key in sorted(tensors):
        little = np.dtype(tensors[key].dtype).newbyteorder("<")
        code = _CODES.get(little)
        if code is None:
            raise ValueError(f"safetensors cannot hold {key!r} of dtype {tensors[key].dtype}")
        array = np.ascontiguousarray(tensors[key], dtype=little)
        header[key] = {"dtype": code, "shape": list(array.shape), "data_offsets": [offset, offset + array.nbytes]}
        arrays.append(array)
        offset += array.nbytes
    encoded = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    encoded += b" " * (-len(encoded) % 8)
    return b"".join([struct.pack("<Q", len(encoded)), encoded, *(a.tobytes() for a in arrays)])


def read_npz(content: bytes) -> tuple[dict[str, Array], dict[str, str]]:
    """An npz answer's arrays and, as metadata, its `__response__` JSON (API.md)."""
    with np.load(io.BytesIO(content), allow_pickle=False) as npz:
        arrays = {key: npz[key] for key in npz.files}
    response = arrays.pop("__response__", None)
    return arrays, ({"response": str(response)} if response is not None else {})


def binary_answer(content: bytes, fmt: str) -> tuple[dict[str, Array], dict[str, Any]]:
    """The tensors of a safetensors/npz answer and the rest of the JSON answer its metadata carries."""
    tensors, metadata = read_safetensors(content) if fmt == "safetensors" else read_npz(content)
    rest: dict[str, Any] = json.loads(metadata["response"]) if "response" in metadata else {}
    return tensors, rest


def from_json_tensor(payload: Mapping[str, Any]) -> Array:
    """API.md's JSON tensor `{"shape", "dtype", "data"}` as an array (bfloat16 as float32)."""
    dtype = payload.get("dtype", "float32")
    np_dtype = np.float32 if dtype == "bfloat16" else np.dtype(INPUT_DTYPES.get(dtype, "<f4")).newbyteorder("=")
    array = np.asarray(payload["data"], dtype=np_dtype)
    return array.reshape(tuple(payload["shape"]))


def to_numpy(value: Any) -> tuple[Array, str]:
    """A NumPy array or torch tensor as (little-endian array, API dtype name); bfloat16 stays bfloat16 bits."""
    if isinstance(value, np.ndarray):
        array = value
    elif type(value).__module__.startswith("torch") and hasattr(value, "detach"):
        tensor = value.detach().cpu()
        if str(tensor.dtype) == "torch.bfloat16":
            import torch

            bits = tensor.contiguous().view(torch.int16).numpy().view("<u2")
            return bits, "bfloat16"
        array = tensor.numpy()
    else:
        raise TypeError(f"expected a NumPy array or a torch tensor, got {type(value).__name__}")
    for name, code in INPUT_DTYPES.items():
        if array.dtype == np.dtype(code).newbyteorder("="):
            return np.ascontiguousarray(array, dtype=np.dtype(code)), name
    raise TypeError(f"tensor dtype {array.dtype} is not one the server takes ({', '.join(INPUT_DTYPES)})")


def tensor_input(value: Any, *, binary: bool) -> dict[str, Any]:
    """One sample as an input item: base64 of its bytes (`binary`) or nested lists."""
    array, dtype = to_numpy(value)
    payload: dict[str, Any] = {"shape": list(array.shape), "dtype": dtype}
    if binary:
        payload["b64"] = base64.b64encode(array.tobytes()).decode("ascii")
    elif dtype == "bfloat16":
        payload["data"] = bfloat16_to_float32(array).tolist()
    else:
        payload["data"] = array.tolist()
    return {"tensor": payload}
