"""The Open Inference Protocol wire format: compression, framing, BYTES, every datatype, BF16 bits."""

from __future__ import annotations

import gzip
import zlib
from typing import Any

import numpy as np
import pytest
import torch
from tritonclient.http import InferResult
from tritonclient.utils import serialize_byte_tensor, triton_to_np_dtype

from service.codecs.oip import (
    bf16_bits_to_float32,
    decode_tensor,
    decompress,
    deserialize_bytes,
    encode_response,
    encode_tensor,
    float32_to_bf16_bits,
    serialize_bytes,
    split_body,
)
from service.errors import BadInput, InvalidField, TooLarge
from service.specs.vocab import Datatype

PAYLOAD = b'{"inputs": []}' * 50
NUMERIC = [d for d in Datatype if d not in (Datatype.BYTES, Datatype.BF16)]


# ---- compression and framing --------------------------------------------------------------


@pytest.mark.parametrize(
    ("encoding", "packed"),
    [
        (None, PAYLOAD),
        ("identity", PAYLOAD),
        ("gzip", gzip.compress(PAYLOAD)),
        ("GZIP", gzip.compress(PAYLOAD)),
        ("deflate", zlib.compress(PAYLOAD)),
        ("deflate", zlib.compress(PAYLOAD)[2:-4]),  # raw deflate, as some clients send it
    ],
    ids=["none", "identity", "gzip", "GZIP", "deflate-zlib", "deflate-raw"],  # stable: gzip bytes hold the time
)
def test_decompress(encoding: str | None, packed: bytes) -> None:
    assert decompress(packed, encoding, len(PAYLOAD)) == PAYLOAD


def test_decompress_refuses() -> None:
    with pytest.raises(TooLarge, match="max_body_bytes"):
        decompress(gzip.compress(PAYLOAD), "gzip", len(PAYLOAD) - 1)
    with pytest.raises(BadInput, match="not valid gzip"):
        decompress(b"plain text", "gzip", 1000)
    with pytest.raises(BadInput, match="truncated"):
        decompress(gzip.compress(PAYLOAD)[:20], "gzip", 10_000)
    with pytest.raises(BadInput, match="unsupported Content-Encoding 'br'"):
        decompress(PAYLOAD, "br", 10_000)


def test_split_body() -> None:
    assert split_body(b'{"a": 1}xyz', None) == (b'{"a": 1}xyz', b"")
    assert split_body(b'{"a": 1}xyz', "8") == (b'{"a": 1}', b"xyz")
    for bad in ("-1", "twelve", "12"):
        with pytest.raises(BadInput, match="Inference-Header-Content-Length"):
            split_body(b'{"a": 1}xyz', bad)


def test_bytes_serialization_matches_tritonclient() -> None:
    items = [b"", b"a", "été".encode(), bytes(range(256))]
    ours = serialize_bytes(items)
    assert ours == serialize_byte_tensor(np.array(items, dtype=np.object_)).item()
    assert ours[:8] == b"\x00\x00\x00\x00\x01\x00\x00\x00"
    assert deserialize_bytes(ours, "t") == items
    with pytest.raises(BadInput, match="runs past"):
        deserialize_bytes(b"\x05\x00\x00\x00abc", "t")
    with pytest.raises(BadInput, match="inside an element length"):
        deserialize_bytes(b"\x01\x00\x00\x00a\x02", "t")


# ---- decoding request tensors ---------------------------------------------------------------


def reference_dtype(datatype: Datatype) -> np.dtype[Any]:
    """The protocol's NumPy dtype by tritonclient, not by the table under test."""
    dtype: np.dtype[Any] = np.dtype(triton_to_np_dtype(datatype.value))
    return dtype


def sample(datatype: Datatype) -> np.ndarray[Any, Any]:
    """Negative values for signed types, values over the signed range for unsigned ones."""
    values = np.array([[0, 1, 2], [3, 4, 5]])
    dtype = reference_dtype(datatype)
    if datatype is Datatype.BOOL:
        return np.asarray(values % 2 == 1)
    if datatype.value.startswith("INT"):
        return (values - 3).astype(dtype)
    if datatype.value.startswith("UINT"):
        high: np.ndarray[Any, Any] = values.astype(dtype) + dtype.type(np.iinfo(dtype).max - 5)
        return high
    floats: np.ndarray[Any, Any] = (values * 1.5).astype(dtype)
    return floats


@pytest.mark.parametrize("datatype", NUMERIC)
def test_decode_every_datatype(datatype: Datatype) -> None:
    expected = sample(datatype)
    binary = decode_tensor("x", [2, 3], datatype, None, expected.tobytes())
    nested = decode_tensor("x", [2, 3], datatype, expected.tolist(), None)
    flat = decode_tensor("x", [2, 3], datatype, expected.reshape(-1).tolist(), None)
    for got in (binary, nested, flat):
        assert got.dtype == expected.dtype
        np.testing.assert_array_equal(got, expected)
    assert binary.flags.writeable


def test_decode_size_mismatches() -> None:
    with pytest.raises(InvalidField, match="23 bytes of binary data; shape \\[2, 3\\] of FP32 needs 24"):
        decode_tensor("x", [2, 3], Datatype.FP32, None, bytes(23))
    with pytest.raises(InvalidField, match="data has 5 values; shape \\[2, 3\\] needs 6"):
        decode_tensor("x", [2, 3], Datatype.FP32, [1, 2, 3, 4, 5], None)
    with pytest.raises(InvalidField, match="must be INT8 values"):
        decode_tensor("x", [1], Datatype.INT8, ["abc"], None)
    with pytest.raises(InvalidField, match="give 'data' or a 'binary_data_size'"):
        decode_tensor("x", [1], Datatype.FP32, None, None)
    with pytest.raises(InvalidField, match="not a valid shape"):
        decode_tensor("x", [-1, 3], Datatype.FP32, [], None)


def test_bytes_whose_last_element_is_empty() -> None:
    """The last element's 4-byte length ends the data exactly (found by `make mutate`)."""
    for items in ([b"a", b""], [b""]):
        assert deserialize_bytes(serialize_bytes(items), "t") == items


def test_a_zero_size_dimension_is_a_valid_shape() -> None:
    """Only negative sizes are refused (found by `make mutate`); [2, 0] holds no values."""
    assert decode_tensor("x", [2, 0], Datatype.FP32, [], None).shape == (2, 0)
    assert decode_tensor("x", [0], Datatype.FP32, None, b"").shape == (0,)


def test_decode_bytes() -> None:
    json_array = decode_tensor("x", [2, 1], Datatype.BYTES, [["ab"], ["ç"]], None)
    assert json_array.shape == (2, 1)
    assert json_array.reshape(-1).tolist() == [b"ab", "ç".encode()]
    binary = decode_tensor("x", [2], Datatype.BYTES, None, serialize_bytes([b"\x00\xff", b"z"]))
    assert binary.tolist() == [b"\x00\xff", b"z"]
    with pytest.raises(InvalidField, match=r"^in0: 3 BYTES elements; shape \[2\] needs 2"):
        decode_tensor("in0", [2], Datatype.BYTES, ["a", "b", "c"], None)
    with pytest.raises(InvalidField, match="must be strings"):
        decode_tensor("x", [1], Datatype.BYTES, [1], None)


def test_bf16_bits_match_torch() -> None:
    values = torch.tensor(
        [0.0, -0.0, 1.0, 1.00390625, 1.01171875, 3.14159, -2.5e-3, 1e38, 3.4e38, float("inf"), float("-inf")]
    )
    values = torch.cat([values, torch.randn(1000, generator=torch.Generator().manual_seed(0)) * 100])
    expected = values.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(float32_to_bf16_bits(values.numpy()), expected)
    back = bf16_bits_to_float32(expected)
    np.testing.assert_array_equal(back, values.to(torch.bfloat16).float().numpy())
    assert np.isnan(bf16_bits_to_float32(float32_to_bf16_bits(np.array([np.nan], dtype=np.float32)))).all()


def test_decode_bf16() -> None:
    bits = float32_to_bf16_bits(np.array([1.5, -2.0, 0.1], dtype=np.float32))
    from_binary = decode_tensor("x", [3], Datatype.BF16, None, bits.tobytes())
    from_json = decode_tensor("x", [3], Datatype.BF16, [1.5, -2.0, 0.1], None)
    np.testing.assert_array_equal(from_binary, bits)
    np.testing.assert_array_equal(from_json, bits)
    assert bf16_bits_to_float32(from_json)[2] == np.float32(0.10009765625)


# ---- encoding answers -----------------------------------------------------------------------


def test_encode_binary_and_json() -> None:
    logits = np.array([[1.5, -2.0]], dtype=np.float32)
    entry, raw = encode_tensor("output__0", Datatype.FP32, logits, binary=True)
    assert entry == {"name": "output__0", "datatype": "FP32", "shape": [1, 2], "parameters": {"binary_data_size": 8}}
    assert raw == logits.tobytes()
    entry, raw = encode_tensor("output__0", Datatype.FP32, logits, binary=False)
    assert raw is None
    assert entry["data"].tolist() == [1.5, -2.0]
    bits = float32_to_bf16_bits(np.array([[0.5, 3.0]], dtype=np.float32))
    entry, _ = encode_tensor("h", Datatype.BF16, bits, binary=False)
    assert entry["data"].tolist() == [0.5, 3.0]
    classes = np.array([[b"2.000000:1:cat"]], dtype=np.object_)
    entry, _ = encode_tensor("c", Datatype.BYTES, classes, binary=False)
    assert entry["data"] == ["2.000000:1:cat"]


def test_response_read_by_tritonclient() -> None:
    logits = np.arange(6, dtype=np.float32).reshape(2, 3)
    classes = np.array([[b"5.000000:2:c"], [b"2.000000:2:c"]], dtype=np.object_)
    half = np.array([1, 2], dtype=np.float16)
    a, raw_a = encode_tensor("output__0", Datatype.FP32, logits, binary=True)
    b, raw_b = encode_tensor("classes", Datatype.BYTES, classes, binary=True)
    c, _ = encode_tensor("half", Datatype.FP16, half, binary=False)
    assert raw_a is not None
    assert raw_b is not None
    body, header_length = encode_response({"model_name": "m", "outputs": [a, b, c]}, [raw_a, raw_b])
    assert header_length is not None
    result = InferResult.from_response_body(body, header_length=header_length)
    np.testing.assert_array_equal(result.as_numpy("output__0"), logits)
    assert result.as_numpy("classes").tolist() == classes.tolist()
    np.testing.assert_array_equal(result.as_numpy("half"), half)
    json_only, none = encode_response({"model_name": "m", "outputs": [c]}, [])
    assert none is None
    assert InferResult.from_response_body(json_only).as_numpy("half").tolist() == [1.0, 2.0]
