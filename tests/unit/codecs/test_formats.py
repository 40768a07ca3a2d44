"""The one table of file formats: every format a vocabulary offers has a row, and each row writes its format."""

from __future__ import annotations

import io
import json
import struct

import numpy as np
import pytest
import torch
from safetensors.torch import load as safetensors_load

from service.codecs.binary import safetensors_parts
from service.codecs.formats import FORMATS, file_format
from service.specs.vocab import ActivationFormat, SaliencyFormat, TensorFileFormat, TensorFormat

NOT_FILES = {"json", "stats", "png"}  # answered as JSON or a picture, not by the table


@pytest.mark.parametrize("vocabulary", [TensorFormat, ActivationFormat, SaliencyFormat, TensorFileFormat])
def test_every_file_format_offered_has_a_row(vocabulary: type[TensorFormat]) -> None:
    offered = {member.value for member in vocabulary} - NOT_FILES
    assert offered <= set(FORMATS)


def test_rows_write_their_own_format() -> None:
    tensors = {"a": torch.arange(6, dtype=torch.float32).reshape(2, 3)}
    rest = {"model": "m"}
    safetensors = file_format("safetensors").file_bytes(tensors, rest)
    (length,) = struct.unpack("<Q", safetensors[:8])
    header = json.loads(safetensors[8 : 8 + length])
    assert header["a"]["shape"] == [2, 3]
    assert json.loads(header["__metadata__"]["response"]) == rest
    with np.load(io.BytesIO(file_format("npz").file_bytes(tensors, rest))) as npz:
        assert npz["a"].tolist() == [[0, 1, 2], [3, 4, 5]]
        assert json.loads(str(npz["__response__"])) == rest
    assert np.load(io.BytesIO(file_format("npy").file_bytes(tensors, rest))).tolist() == [[0, 1, 2], [3, 4, 5]]


def test_npy_holds_one_tensor() -> None:
    two = {"a": torch.zeros(1), "b": torch.zeros(1)}
    with pytest.raises(ValueError, match="holds one tensor"):
        file_format("npy").encode(two, {})


def test_safetensors_parts_are_the_tensors_own_bytes() -> None:
    """The header, then a view of each tensor's memory (nothing copied); joined, they are the file."""
    a = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    b = torch.ones(4, dtype=torch.bfloat16)
    header, *views = safetensors_parts({"a": a, "b": b}, {"model": "m"})
    assert [bytes(v) for v in views] == [a.numpy().tobytes(), b.view(torch.int16).numpy().tobytes()]
    a[0, 0] = 42.0
    assert bytes(views[0])[:4] == struct.pack("<f", 42.0)  # a view, not a copy
    loaded = safetensors_load(b"".join([header, *views]))
    assert torch.equal(loaded["a"], a)
    assert torch.equal(loaded["b"], b)
