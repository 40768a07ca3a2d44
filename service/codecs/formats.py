"""The one table of binary answer formats: name -> media type, file extension, encoder.

Every binary answer (activations, gradients, saliency, a state-dict tensor) is written by a
row of this table. An encoder takes the answer's tensors and the rest of the JSON answer
(kept as file metadata where the format has room for it) and returns the file as parts in
order, so a format laid out as header-then-tensors is served from the tensors' own memory.
To add a format, write its encoder in a codec module, add a row here, and offer it in the
endpoints' format vocabularies (`service.specs.vocab`); `tests/unit/codecs/test_formats.py`
checks each vocabulary against this table.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from service.codecs.binary import Buffer, npy_file_bytes, npz_bytes, safetensors_parts

OCTET = "application/octet-stream"
Encoder = Callable[[Mapping[str, torch.Tensor], Mapping[str, Any]], Sequence[Buffer]]


@dataclass(frozen=True)
class FileFormat:
    name: str
    media_type: str
    extension: str
    encode: Encoder
    many: bool = True  # holds several named tensors (npy holds one)

    def file_bytes(self, tensors: Mapping[str, torch.Tensor], rest: Mapping[str, Any]) -> bytes:
        """The whole file in one bytes object."""
        return b"".join(self.encode(tensors, rest))


def _whole(encode: Callable[[Mapping[str, torch.Tensor], Mapping[str, Any]], bytes]) -> Encoder:
    """An encoder of a format written in one piece."""

    def parts(tensors: Mapping[str, torch.Tensor], rest: Mapping[str, Any]) -> Sequence[Buffer]:
        return [encode(tensors, rest)]

    return parts


FORMATS: dict[str, FileFormat] = {
    f.name: f
    for f in (
        FileFormat("safetensors", OCTET, "safetensors", safetensors_parts),
        FileFormat("npz", OCTET, "npz", _whole(npz_bytes)),
        FileFormat("npy", OCTET, "npy", _whole(npy_file_bytes), many=False),
    )
}


def file_format(name: str) -> FileFormat:
    """The table's row for `name`; a name outside the table is a programming error (vocabularies are checked)."""
    return FORMATS[name]
