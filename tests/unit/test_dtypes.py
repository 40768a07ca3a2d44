"""The one dtype table, each row checked against torch's, NumPy's, safetensors' and tritonclient's own definitions."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import torch
from safetensors.torch import save
from tritonclient.utils import np_to_triton_dtype, triton_to_np_dtype

from service.dtypes import BY_NAME, BY_OIP, BY_SAFETENSORS, BY_TORCH, DTYPES, DtypeInfo, dtype_name
from service.specs.vocab import TENSOR_DTYPES

ROWS = [pytest.param(row, id=row.name) for row in DTYPES]
OIP_ROWS = [pytest.param(row, id=row.name) for row in DTYPES if row.oip is not None]


@pytest.mark.parametrize("row", ROWS)
def test_the_name_is_torchs(row: DtypeInfo) -> None:
    assert str(row.torch) == f"torch.{row.name}"
    assert dtype_name(row.torch) == row.name


@pytest.mark.parametrize("row", ROWS)
def test_the_wire_layout_has_the_element_size_of_the_torch_dtype(row: DtypeInfo) -> None:
    assert row.wire.itemsize == torch.empty((), dtype=row.torch).element_size()
    assert row.wire.byteorder in ("<", "|", "=")


@pytest.mark.parametrize("row", ROWS)
def test_the_numpy_dtype_is_what_torch_converts_to(row: DtypeInfo) -> None:
    try:
        expected = torch.zeros(1, dtype=row.torch).numpy().dtype
    except TypeError:  # NumPy has no such dtype
        assert row.numpy is None
        return
    assert row.numpy == expected


@pytest.mark.parametrize("row", ROWS)
def test_the_safetensors_code_is_what_safetensors_writes(row: DtypeInfo) -> None:
    data = save({"x": torch.zeros(2, dtype=row.torch)})
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    assert row.safetensors == header["x"]["dtype"]


@pytest.mark.parametrize("row", OIP_ROWS)
def test_the_oip_datatype_is_tritons(row: DtypeInfo) -> None:
    assert row.oip is not None
    if row.numpy is not None:
        assert np_to_triton_dtype(row.numpy) == row.oip
        assert np.dtype(triton_to_np_dtype(row.oip)) == row.numpy
    else:  # BF16 has no NumPy dtype: tritonclient carries it as float32 values, we as 16-bit patterns
        assert row.oip == "BF16"
        assert row.wire == np.dtype("<u2")


def test_lookups_are_one_to_one() -> None:
    assert len(BY_NAME) == len(BY_TORCH) == len(DTYPES)
    assert len(BY_SAFETENSORS) == len([r for r in DTYPES if r.safetensors])
    assert len(BY_OIP) == len([r for r in DTYPES if r.oip])


def test_every_request_dtype_name_is_in_the_table() -> None:
    assert set(TENSOR_DTYPES) <= set(BY_NAME)
