"""Open Inference Protocol tensors: JSON data and the binary tensor extension (NumPy only).

Binary extension (Triton's `binary_tensor_data`): the body is the JSON header, then each
binary tensor's raw little-endian bytes in order; `Inference-Header-Content-Length` gives the
JSON's length and `parameters.binary_data_size` each tensor's. BYTES elements are each a
4-byte little-endian length and the bytes. BF16 travels as its 16-bit patterns; here it is
held as a uint16 array of those bits.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson

from service.dtypes import BY_OIP
from service.errors import BadInput, InvalidField, TooLarge
from service.specs.vocab import Datatype

HEADER_LENGTH = "Inference-Header-Content-Length"
MAX_DIMS = 8


def wire_dtype(datatype: Datatype) -> np.dtype[Any]:
    """How one element of `datatype` is laid out (BF16 as its bit patterns; BYTES as Python objects)."""
    if datatype is Datatype.BYTES:
        return np.dtype(object)
    return BY_OIP[datatype.value].wire


def decompress(body: bytes, encoding: str | None, limit: int) -> bytes:
    """Undo `Content-Encoding: gzip|deflate` (zlib or raw deflate), refusing more than `limit` bytes out."""
    name = (encoding or "identity").strip().lower()
    if name in ("", "identity"):
        return body
    if name in ("gzip", "x-gzip"):
        wbits = 16 + zlib.MAX_WBITS
    elif name == "deflate":
        zlib_header = len(body) >= 2 and body[0] & 0x0F == 8 and (body[0] << 8 | body[1]) % 31 == 0
        wbits = zlib.MAX_WBITS if zlib_header else -zlib.MAX_WBITS  # HTTP deflate is zlib; some send it raw
    else:
        raise BadInput(f"unsupported Content-Encoding {encoding!r}; use gzip or deflate")
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error:
        raise BadInput(f"body is not valid {name} data") from None
    if len(out) > limit:
        raise TooLarge(f"decompressed body over the {limit}-byte limit (max_body_bytes)")
    if not inflater.eof:
        raise BadInput(f"body is truncated {name} data")
    return out


def split_body(body: bytes, header_length: str | None) -> tuple[bytes, bytes]:
    """The JSON header and the binary rest; without the header all of `body` is JSON."""
    if header_length is None:
        return body, b""
    text = header_length.strip()
    if not text.isdigit() or int(text) > len(body):
        raise BadInput(f"{HEADER_LENGTH} {header_length!r} is not a length within the {len(body)}-byte body")
    n = int(text)
    return body[:n], body[n:]


def serialize_bytes(items: Sequence[bytes]) -> bytes:
    """BYTES elements as 4-byte little-endian lengths, each followed by its bytes."""
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


def deserialize_bytes(raw: bytes, where: str) -> list[bytes]:
    items: list[bytes] = []
    pos = 0
    while pos < len(raw):
        if pos + 4 > len(raw):
            raise BadInput(f"{where}: BYTES data ends inside an element length")
        (size,) = struct.unpack_from("<I", raw, pos)
        pos += 4
        if pos + size > len(raw):
            raise BadInput(f"{where}: BYTES element of {size} bytes runs past the data")
        items.append(raw[pos : pos + size])
        pos += size
    return items


def decode_tensor(
    where: str, shape: Sequence[int], datatype: Datatype, data: Any, raw: bytes | None
) -> np.ndarray[Any, Any]:
    """One request tensor as an array of `shape`: from `raw` bytes (binary) or JSON `data`.

    BYTES gives an object array of `bytes`; BF16 an array of uint16 bit patterns.
    """
    if len(shape) > MAX_DIMS or any(int(s) < 0 for s in shape):
        raise InvalidField(f"{where}: shape {list(shape)} is not a valid shape")
    numel = math.prod(shape)
    if raw is not None:
        if datatype is Datatype.BYTES:
            items = deserialize_bytes(raw, where)
            return _object_array(items, numel, shape, where)
        dtype = wire_dtype(datatype)
        if len(raw) != numel * dtype.itemsize:
            raise InvalidField(
                f"{where}: {len(raw)} bytes of binary data; shape {list(shape)} of {datatype} needs "
                f"{numel * dtype.itemsize}"
            )
        return np.frombuffer(raw, dtype=dtype).reshape(tuple(shape)).copy()
    if data is None:
        raise InvalidField(f"{where}: give 'data' or a 'binary_data_size' parameter with bytes after the JSON")
    if datatype is Datatype.BYTES:
        flat = _flatten(data)
        if not all(isinstance(v, str) for v in flat):
            raise InvalidField(f"{where}: BYTES data must be strings")
        return _object_array([v.encode() for v in flat], numel, shape, where)
    try:
        if datatype is Datatype.BF16:
            array = float32_to_bf16_bits(np.asarray(data, dtype=np.float32))
        else:
            array = np.asarray(data, dtype=wire_dtype(datatype))
    except (ValueError, TypeError, OverflowError):
        raise InvalidField(f"{where}: data must be {datatype} values in a flat or nested list") from None
    if array.size != numel:
        raise InvalidField(f"{where}: data has {array.size} values; shape {list(shape)} needs {numel}")
    return array.reshape(tuple(shape))


def _flatten(data: Any) -> list[Any]:
    if not isinstance(data, list):
        return [data]
    out: list[Any] = []
    for item in data:
        out.extend(_flatten(item))
    return out


def _object_array(items: list[bytes], numel: int, shape: Sequence[int], where: str) -> np.ndarray[Any, Any]:
    if len(items) != numel:
        raise InvalidField(f"{where}: {len(items)} BYTES elements; shape {list(shape)} needs {numel}")
    array = np.empty(numel, dtype=object)
    array[:] = items
    return array.reshape(tuple(shape))


def bf16_bits_to_float32(bits: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """BF16 bit patterns to the exactly equal float32 values."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def float32_to_bf16_bits(values: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Round float32 to the nearest BF16 (ties to even, as torch does); NaN stays NaN."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = np.isnan(values)
    return np.where(nan, (bits >> 16) | 0x0040, rounded).astype(np.uint16)


def encode_tensor(
    name: str, datatype: Datatype, array: np.ndarray[Any, Any], binary: bool
) -> tuple[dict[str, Any], bytes | None]:
    """One response tensor: its JSON entry, and its bytes when `binary` (then the entry has no `data`)."""
    entry: dict[str, Any] = {"name": name, "datatype": datatype.value, "shape": list(array.shape)}
    if binary:
        if datatype is Datatype.BYTES:
            raw = serialize_bytes([bytes(item) for item in array.reshape(-1)])
        else:
            raw = np.ascontiguousarray(array, dtype=wire_dtype(datatype)).tobytes()
        entry["parameters"] = {"binary_data_size": len(raw)}
        return entry, raw
    flat = array.reshape(-1)
    if datatype is Datatype.BYTES:
        entry["data"] = [bytes(item).decode("utf-8", errors="replace") for item in flat]
    elif datatype is Datatype.BF16:
        entry["data"] = np.ascontiguousarray(bf16_bits_to_float32(flat))
    else:
        entry["data"] = np.ascontiguousarray(flat)
    return entry, None


def encode_response(header: dict[str, Any], chunks: Sequence[bytes]) -> tuple[bytes, int | None]:
    """The body and, when binary chunks follow the JSON, the JSON's length for `Inference-Header-Content-Length`."""
    head = orjson.dumps(header, option=orjson.OPT_SERIALIZE_NUMPY)
    if not chunks:
        return head, None
    return b"".join([head, *chunks]), len(head)
