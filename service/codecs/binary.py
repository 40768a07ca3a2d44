"""Binary answers: safetensors and npz files whose metadata carries the JSON answer; npy."""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

import numpy as np
import orjson
import torch
from safetensors.torch import save as safetensors_save

from service.codecs.tensors import to_numpy


def _response_json(rest: Mapping[str, Any]) -> str:
    return orjson.dumps(rest, option=orjson.OPT_SERIALIZE_NUMPY).decode()


def safetensors_bytes(tensors: Mapping[str, torch.Tensor], rest: Mapping[str, Any]) -> bytes:
    """One safetensors file; `__metadata__` is `{"response": <rest as JSON>}`."""
    prepared = {k: _cpu_contiguous(v) for k, v in tensors.items()}
    return safetensors_save(prepared, metadata={"response": _response_json(rest)})


def npz_bytes(tensors: Mapping[str, torch.Tensor], rest: Mapping[str, Any]) -> bytes:
    """A NumPy .npz; the JSON answer is a 0-d unicode array named `__response__`."""
    arrays: dict[str, Any] = {k: to_numpy(v) for k, v in tensors.items()}
    arrays["__response__"] = np.array(_response_json(rest))
    buffer = io.BytesIO()
    np.savez(buffer, allow_pickle=False, **arrays)
    return buffer.getvalue()


def npy_bytes(tensor: torch.Tensor) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, to_numpy(tensor), allow_pickle=False)
    return buffer.getvalue()


def binary_size(tensors: Mapping[str, torch.Tensor]) -> int:
    """Bytes the tensors take (the bulk of any binary answer)."""
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _cpu_contiguous(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    return t.contiguous()
