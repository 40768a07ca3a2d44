"""Checkpoints too large to build with torch.save in a test: written opcode by opcode, in a second or two."""

from __future__ import annotations

import io
import struct
import zipfile


def _unicode(text: str) -> bytes:
    data = text.encode()
    return b"X" + struct.pack("<I", len(data)) + data  # BINUNICODE


def shared_tensor_zip(entries: int) -> bytes:
    """A torch zip checkpoint whose state dict maps `entries` keys to one one-element tensor.

    The same file `torch.save({f"w{i}": t for i in range(entries)})` writes for one shared `t`:
    the tensor is pickled once and memoized, every other key refers back to it, so a million
    entries take 12 bytes each. `torch.load` would build every one of them.
    """
    tensor = b"".join(
        [
            b"\x80\x02c" + b"torch._utils\n_rebuild_tensor_v2\n",  # PROTO 2, GLOBAL
            b"(" + b"(" + _unicode("storage") + b"ctorch\nFloatStorage\n" + _unicode("0") + _unicode("cpu"),
            b"K\x01tQ",  # numel 1, TUPLE, BINPERSID
            b"K\x00" + b"K\x01\x85" + b"K\x01\x85" + b"\x89",  # offset, size (1,), stride (1,), False
            b"ccollections\nOrderedDict\n)R",  # OrderedDict()
            b"tR" + b"r\x00\x00\x00\x00",  # TUPLE, REDUCE, LONG_BINPUT 0
        ]
    )
    body = io.BytesIO()
    body.write(b"}")  # EMPTY_DICT
    for start in range(0, entries, 1000):
        body.write(b"(")
        for i in range(start, min(start + 1000, entries)):
            key = _unicode(f"w{i}")
            body.write(key + (tensor[2:] if i == 0 else b"j\x00\x00\x00\x00"))  # LONG_BINGET 0
        body.write(b"u")  # SETITEMS
    pickle = b"\x80\x02" + body.getvalue() + b"."
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", pickle)
        archive.writestr("archive/byteorder", "little")
        archive.writestr("archive/data/0", struct.pack("<f", 1.0))
        archive.writestr("archive/version", "3\n")
    return out.getvalue()
