"""The one dtype table: our name ↔ torch ↔ NumPy ↔ safetensors ↔ Open Inference Protocol.

Every codec and every introspection answer looks a dtype up here, so a dtype means the
same thing in a JSON tensor, a safetensors or npz answer, a checkpoint and a /v2 tensor.
`wire` is how one element is laid out in little-endian bytes; NumPy has no bfloat16, so
bfloat16 travels as its 16-bit patterns (`<u2`) and becomes float32 where NumPy must hold it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True)
class DtypeInfo:
    name: str  # the name in our answers: torch's without the "torch." prefix
    torch: torch.dtype
    wire: np.dtype[Any]  # little-endian element layout on the wire
    numpy: np.dtype[Any] | None  # NumPy's own dtype; None where NumPy has none
    safetensors: str | None  # safetensors' dtype code
    oip: str | None  # the Open Inference Protocol datatype


def _row(name: str, wire: str, safetensors: str | None, oip: str | None, numpy: bool = True) -> DtypeInfo:
    dtype = getattr(torch, name)
    layout = np.dtype(wire)
    return DtypeInfo(name, dtype, layout, layout if numpy else None, safetensors, oip)


DTYPES: tuple[DtypeInfo, ...] = (
    _row("bool", "?", "BOOL", "BOOL"),
    _row("uint8", "u1", "U8", "UINT8"),
    _row("uint16", "<u2", "U16", "UINT16"),
    _row("uint32", "<u4", "U32", "UINT32"),
    _row("uint64", "<u8", "U64", "UINT64"),
    _row("int8", "i1", "I8", "INT8"),
    _row("int16", "<i2", "I16", "INT16"),
    _row("int32", "<i4", "I32", "INT32"),
    _row("int64", "<i8", "I64", "INT64"),
    _row("float16", "<f2", "F16", "FP16"),
    _row("bfloat16", "<u2", "BF16", "BF16", numpy=False),
    _row("float32", "<f4", "F32", "FP32"),
    _row("float64", "<f8", "F64", "FP64"),
    _row("float8_e4m3fn", "u1", "F8_E4M3", None, numpy=False),
    _row("float8_e5m2", "u1", "F8_E5M2", None, numpy=False),
)

BY_NAME: dict[str, DtypeInfo] = {d.name: d for d in DTYPES}
BY_TORCH: dict[torch.dtype, DtypeInfo] = {d.torch: d for d in DTYPES}
BY_SAFETENSORS: dict[str, DtypeInfo] = {d.safetensors: d for d in DTYPES if d.safetensors is not None}
BY_OIP: dict[str, DtypeInfo] = {d.oip: d for d in DTYPES if d.oip is not None}


def dtype_name(dtype: torch.dtype) -> str:
    """`float32` for `torch.float32`; dtypes outside the table keep torch's own name."""
    info = BY_TORCH.get(dtype)
    return info.name if info is not None else str(dtype).removeprefix("torch.")
