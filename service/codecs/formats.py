"""The one table of binary answer formats: name -> media type, file extension, encoder.

Every binary answer (activations, gradients, saliency, a state-dict tensor) is written by a
row of this table. An encoder takes the answer's tensors and the rest of the JSON answer
(kept as file metadata where the format has room for it). To add a format, write its encoder
in a codec module, add a row here, and offer it in the endpoints' format vocabularies
(`service.specs.vocab`); `tests/unit/codecs/test_formats.py` checks each vocabulary against this table.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from service.codecs.binary import npy_file_bytes, npz_bytes, safetensors_bytes

OCTET = "application/octet-stream"
Encoder = Callable[[Mapping[str, torch.Tensor], Mapping[str, Any]], bytes]


@dataclass(frozen=True)
class FileFormat:
    name: str
    media_type: str
    extension: str
    encode: Encoder
    many: bool = True  # holds several named tensors (npy holds one)


FORMATS: dict[str, FileFormat] = {
    f.name: f
    for f in (
        FileFormat("safetensors", OCTET, "safetensors", safetensors_bytes),
        FileFormat("npz", OCTET, "npz", npz_bytes),
        FileFormat("npy", OCTET, "npy", npy_file_bytes, many=False),
    )
}


def file_format(name: str) -> FileFormat:
    """The table's row for `name`; a name outside the table is a programming error (vocabularies are checked)."""
    return FORMATS[name]
