"""Whether a JPEG holds all the data its header promises, read from its markers without decoding.

libjpeg (PIL's and torchvision's) and nvJPEG decode a JPEG whose entropy-coded data stops
early, an end-of-image marker included, by filling the missing blocks with grey, and say so
only in a warning: a 631-byte file whose header says 6000x6000 decodes "fine". Two checks
catch that without decoding. The file must reach its end-of-image marker (EOI, FFD9). And a
Huffman-coded JPEG spends at least one bit per 8x8 block on each block's DC coefficient in
its first scan, so its scans must hold at least blocks / 8 bytes; arithmetic-coded and
DNL-sized JPEGs get the first check only.
"""

from __future__ import annotations

import math
import struct

_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_ARITHMETIC = {0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_STANDALONE = {0x01, *range(0xD0, 0xD8)}  # TEM, RST0-7: no length
_SOS, _EOI = 0xDA, 0xD9


def jpeg_is_complete(data: bytes) -> bool:
    """False when the JPEG ends before its EOI, or its scans are too short for the size its header declares."""
    if data[:2] != b"\xff\xd8":
        return False
    pos, frame, scanned = 2, None, 0
    try:
        while True:
            if data[pos] != 0xFF:
                return False
            while data[pos] == 0xFF:  # fill bytes
                pos += 1
            marker = data[pos]
            pos += 1
            if marker == _EOI:
                break
            if marker in _STANDALONE:
                continue
            (length,) = struct.unpack_from(">H", data, pos)
            if marker in _SOF:
                frame = (marker, data[pos + 2 : pos + length])
            pos += length
            if marker == _SOS:
                end = _end_of_entropy_data(data, pos)
                scanned += end - pos
                pos = end
    except (IndexError, ValueError, struct.error):
        return False  # the data stopped inside a segment, or before any EOI
    return frame is None or scanned >= _least_bytes(*frame)


def _end_of_entropy_data(data: bytes, pos: int) -> int:
    """Where the next marker (not a stuffed FF00, a fill byte or a restart marker) starts."""
    while True:
        at = data.index(b"\xff", pos)  # ValueError when the data stops first
        following = data[at + 1]
        if following in {0x00, 0xFF} or 0xD0 <= following <= 0xD7:
            pos = at + 1 if following == 0xFF else at + 2
            continue
        return at


def _least_bytes(marker: int, frame: bytes) -> int:
    """The fewest scan bytes a frame of this size can have (0 when it cannot be told)."""
    if marker in _ARITHMETIC or len(frame) < 6 or len(frame) < 6 + 3 * frame[5]:
        return 0  # PIL refuses a short frame header itself
    height, width, count = int.from_bytes(frame[1:3]), int.from_bytes(frame[3:5]), frame[5]
    if height == 0 or count == 0:
        return 0
    factors = [(frame[6 + 3 * i + 1] >> 4, frame[6 + 3 * i + 1] & 15) for i in range(count)]
    h_max, v_max = max(h for h, _ in factors) or 1, max(v for _, v in factors) or 1
    blocks = max(
        math.ceil(math.ceil(width * h / h_max) / 8) * math.ceil(math.ceil(height * v / v_max) / 8) for h, v in factors
    )
    return blocks // 8
