"""Tensor inputs (nested, flat, base64 bytes) and JSON tensor outputs."""

from __future__ import annotations

import base64

import numpy as np
import orjson
import pytest
import torch

from service.codecs.tensors import (
    INPUT_DTYPES,
    decode_b64,
    json_tensor,
    tensor_from_payload,
    to_numpy,
)
from service.dtypes import dtype_name
from service.errors import BadInput, InvalidField


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


@pytest.fixture
def sample() -> torch.Tensor:
    return torch.arange(24, dtype=torch.float32).reshape(2, 3, 4) / 7 - 1


def test_decode_b64_accepts_standard_base64_with_or_without_padding_and_newlines() -> None:
    raw = bytes(range(256)) * 3 + b"xy"
    text = _b64(raw)
    assert text.endswith("=")
    assert decode_b64(text) == raw
    assert decode_b64(text.rstrip("=")) == raw
    assert decode_b64(base64.encodebytes(raw).decode()) == raw  # MIME line breaks


@pytest.mark.parametrize("text", ["!!!!", "ab$d", "a", "abcde", "-_-_"])
def test_decode_b64_rejects_invalid(text: str) -> None:
    with pytest.raises(BadInput, match="field is not valid base64") as info:
        decode_b64(text, "field")
    assert info.value.status == 400


def test_nested_and_flat_data_give_the_same_tensor(sample: torch.Tensor) -> None:
    nested = tensor_from_payload([2, 3, 4], "float32", sample.tolist(), None, "t")
    flat = tensor_from_payload([2, 3, 4], "float32", sample.flatten().tolist(), None, "t")
    assert nested.dtype == torch.float32
    assert torch.equal(nested, sample)
    assert torch.equal(flat, sample)


@pytest.mark.parametrize(
    ("name", "torch_dtype"),
    [
        ("float32", torch.float32),
        ("float16", torch.float16),
        ("float64", torch.float64),
        ("bfloat16", torch.bfloat16),
        ("int64", torch.int64),
        ("int32", torch.int32),
        ("int16", torch.int16),
        ("int8", torch.int8),
        ("uint8", torch.uint8),
        ("bool", torch.bool),
    ],
)
def test_b64_little_endian_bytes_for_every_dtype(name: str, torch_dtype: torch.dtype) -> None:
    values = torch.tensor([[0, 1, 2], [3, 4, 5]]).to(torch_dtype)
    as_bytes = values.view(torch.int16) if torch_dtype == torch.bfloat16 else values
    raw = as_bytes.numpy().astype(as_bytes.numpy().dtype.newbyteorder("<")).tobytes()
    got = tensor_from_payload([2, 3], name, None, _b64(raw), "t")
    assert got.dtype == torch_dtype
    assert torch.equal(got, values)
    from_list = tensor_from_payload([2, 3], name, values.float().tolist(), None, "t")
    assert from_list.dtype == torch_dtype
    assert torch.equal(from_list, values)


def test_float16_b64_keeps_its_precision() -> None:
    values = torch.tensor([0.1, 65504.0, -2.5e-3], dtype=torch.float16)
    got = tensor_from_payload([3], "float16", None, _b64(values.numpy().tobytes()), "t")
    assert got.dtype == torch.float16
    assert torch.equal(got, values)


def test_dtype_list_is_what_the_schema_says() -> None:
    assert set(INPUT_DTYPES) == {
        "float32",
        "float64",
        "float16",
        "bfloat16",
        "int64",
        "int32",
        "int16",
        "int8",
        "uint8",
        "bool",
    }


@pytest.mark.parametrize(
    ("shape", "dtype", "data", "b64", "needle"),
    [
        ([2, 2], "float32", [1.0, 2.0, 3.0], None, "t.data has 3 values; shape [2, 2] needs 4"),
        ([2, 2], "float32", None, _b64(b"\0" * 12), "t.b64 holds 12 bytes; shape [2, 2] needs 16"),
        ([2, 2], "complex64", [1.0] * 4, None, "t.dtype 'complex64' is not one of"),
        ([2, -2], "float32", [1.0] * 4, None, "is not a valid shape"),
        ([1] * 9, "float32", [1.0], None, "is not a valid shape"),
        ([2, 2], "float32", [1.0] * 4, _b64(b"\0" * 16), "exactly one of 'data' or 'b64'"),
        ([2, 2], "float32", None, None, "exactly one of 'data' or 'b64'"),
        ([2, 2], "float32", [[1.0, 2.0], [3.0]], None, "must be numbers"),
        ([2, 2], "float32", ["a", "b", "c", "d"], None, "must be numbers"),
        ([2, 2], "float32", {"a": 1}, None, "must be numbers"),
        (
            [2, 3],
            "float32",
            [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]],
            None,
            "nested as [3, 2]; give it flat or nested as [2, 3]",
        ),
        ([2], "uint8", [1, 300], None, "out of range for uint8"),
        ([2], "int8", [-129, 0], None, "out of range for int8"),
        ([2], "float32", [1e300, 0.0], None, "out of range for float32"),
        ([2], "float16", [1e6, 0.0], None, "out of range for float16"),
    ],
)
def test_invalid_payloads_are_422(shape: list[int], dtype: str, data: object, b64: str | None, needle: str) -> None:
    with pytest.raises(InvalidField) as info:
        tensor_from_payload(shape, dtype, data, b64, "t")
    assert info.value.status == 422
    assert needle in str(info.value.detail)


def test_bad_base64_in_a_tensor_is_400() -> None:
    with pytest.raises(BadInput, match=r"t\.b64 is not valid base64"):
        tensor_from_payload([1], "float32", None, "@@@@", "t")


def test_json_tensor_round_trips_through_orjson(sample: torch.Tensor) -> None:
    encoded = orjson.loads(orjson.dumps(json_tensor(sample), option=orjson.OPT_SERIALIZE_NUMPY))
    assert encoded["shape"] == [2, 3, 4]
    assert encoded["dtype"] == "float32"
    assert torch.equal(torch.tensor(encoded["data"]), sample)


def test_bfloat16_widens_to_float32_for_numpy() -> None:
    t = torch.tensor([1.5, -2.0], dtype=torch.bfloat16)
    array = to_numpy(t)
    assert array.dtype == np.float32
    assert array.tolist() == [1.5, -2.0]
    assert json_tensor(t)["dtype"] == "bfloat16"
    assert dtype_name(torch.float16) == "float16"


def test_to_numpy_is_contiguous() -> None:
    t = torch.arange(6.0).reshape(2, 3).t()
    array = to_numpy(t)
    assert array.flags["C_CONTIGUOUS"]
    assert array.tolist() == t.tolist()
