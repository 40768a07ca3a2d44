"""Every entry of the service's dtype tables, checked against the owning library's definition.

safetensors codes against safetensors' own writer and reader, NumPy dtypes against torch's
`Tensor.numpy()`, Open Inference Protocol datatypes against tritonclient's
`triton_to_np_dtype`. The expectations never come from the tables under test.
"""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch
from safetensors.torch import load as safetensors_load
from safetensors.torch import save as safetensors_save
from safetensors.torch import save_file
from tritonclient.utils import triton_to_np_dtype

from service.codecs.binary import npy_bytes, npz_bytes
from service.codecs.formats import file_format
from service.codecs.oip import wire_dtype
from service.codecs.oip_infer import as_array, datatype_of
from service.dtypes import BY_TORCH
from service.introspection.checkpoint import inspect_checkpoint
from service.specs.vocab import Datatype

# torch dtype -> the datatype the service answers with, for every dtype the protocol has
DATATYPES = {d.torch: Datatype(d.oip) for d in BY_TORCH.values() if d.oip is not None}

# The dtypes safetensors' torch binding writes (and the service may answer with).
SAFETENSORS_DTYPES = [
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
    torch.int16, torch.int8, torch.uint8, torch.bool,
]  # fmt: skip
CHECKPOINT_DTYPES = [*SAFETENSORS_DTYPES, torch.float8_e4m3fn, torch.float8_e5m2]
BFLOAT16: np.dtype[Any] = np.dtype(ml_dtypes.bfloat16)
NUMPY_TORCH_DTYPES = [d for d in SAFETENSORS_DTYPES if d != torch.bfloat16]


def sample(dtype: torch.dtype) -> torch.Tensor:
    """Values that tell signed from unsigned and float16 from bfloat16 apart: -1 and 0.1 exist in few."""
    if dtype == torch.bool:
        return torch.tensor([[True, False], [False, True]])
    if dtype.is_floating_point:
        return torch.tensor([[0.1, -2.5], [1e-3, 300.0]]).to(dtype)
    low = 0 if dtype == torch.uint8 else -1
    return torch.tensor([[low, 1], [2, 100]], dtype=dtype)


def header_codes(content: bytes) -> dict[str, str]:
    (length,) = struct.unpack("<Q", content[:8])
    header = json.loads(content[8 : 8 + length])
    return {k: v["dtype"] for k, v in header.items() if k != "__metadata__"}


@pytest.mark.parametrize("dtype", SAFETENSORS_DTYPES, ids=str)
def test_safetensors_answer_has_the_librarys_code_and_values(dtype: torch.dtype) -> None:
    t = sample(dtype)
    ours = file_format("safetensors").file_bytes({"t": t}, {"note": "x"})
    assert header_codes(ours) == header_codes(safetensors_save({"t": t}))  # the code safetensors writes
    back = safetensors_load(ours)["t"]  # and its reader agrees
    assert back.dtype == dtype
    assert torch.equal(back, t)


@pytest.mark.parametrize("dtype", NUMPY_TORCH_DTYPES, ids=str)
def test_npy_and_npz_answers_have_torchs_numpy_dtype(dtype: torch.dtype) -> None:
    t = sample(dtype)
    expected = t.numpy()
    npy = np.load(io.BytesIO(npy_bytes(t)), allow_pickle=False)
    with np.load(io.BytesIO(npz_bytes({"t": t}, {})), allow_pickle=False) as npz:
        from_npz = npz["t"]
    for got in (npy, from_npz):
        assert got.dtype == expected.dtype
        np.testing.assert_array_equal(got, expected)


def test_bfloat16_npy_is_widened_to_the_same_float32_values() -> None:
    t = sample(torch.bfloat16)
    got = np.load(io.BytesIO(npy_bytes(t)), allow_pickle=False)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, t.float().numpy())


@pytest.mark.parametrize("dtype", CHECKPOINT_DTYPES, ids=str)
@pytest.mark.parametrize("stats", [False, True], ids=["header", "stats"])
def test_checkpoint_reads_each_safetensors_code_as_torchs_dtype(
    tmp_path: Path, dtype: torch.dtype, stats: bool
) -> None:
    """A file written by safetensors itself: the reported dtype is torch's name for the tensor's dtype."""
    t = sample(torch.float32).to(dtype) if dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else sample(dtype)
    path = tmp_path / "one.safetensors"
    save_file({"t": t}, str(path))
    (entry,) = inspect_checkpoint(path, stats=stats)["state_dicts"][""]["entries"]
    assert entry["dtype"] == str(dtype).removeprefix("torch.")
    assert entry["bytes"] == t.numel() * t.element_size()


# ---- Open Inference Protocol -------------------------------------------------------------------


def triton_numpy(datatype: Datatype) -> np.dtype[Any]:
    dtype: np.dtype[Any] = np.dtype(triton_to_np_dtype(datatype.value))
    return dtype


@pytest.mark.parametrize("datatype", [d for d in Datatype if d is not Datatype.BF16], ids=str)
def test_each_datatype_decodes_as_tritonclients_numpy_dtype(datatype: Datatype) -> None:
    assert wire_dtype(datatype) == triton_numpy(datatype)


def test_bf16_travels_as_16_bit_patterns() -> None:
    assert triton_numpy(Datatype.BF16) == BFLOAT16
    assert wire_dtype(Datatype.BF16) == np.dtype("<u2")  # held as the bits, as the module says


def torch_numpy(dtype: torch.dtype) -> np.dtype[Any]:
    """NumPy's dtype for a torch dtype, by torch itself (bfloat16: ml_dtypes', which tritonclient uses)."""
    numpy_dtype: np.dtype[Any] = BFLOAT16 if dtype == torch.bfloat16 else torch.zeros(1, dtype=dtype).numpy().dtype
    return numpy_dtype


@pytest.mark.parametrize("dtype", list(DATATYPES), ids=str)
def test_each_torch_dtype_answers_as_its_datatype(dtype: torch.dtype) -> None:
    assert triton_numpy(DATATYPES[dtype]) == torch_numpy(dtype)
    assert datatype_of(dtype) is DATATYPES[dtype]
    datatype, array = as_array(torch.zeros(2, dtype=dtype))
    assert datatype is DATATYPES[dtype]
    assert array.dtype.itemsize == torch_numpy(dtype).itemsize


def test_every_protocol_number_type_has_a_torch_dtype() -> None:
    """The datatypes torch can hold are all answerable (BYTES is for strings and images only)."""
    assert {d.value for d in DATATYPES.values()} == {d.value for d in Datatype} - {"BYTES"}
