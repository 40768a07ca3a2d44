"""A JPEG is complete when it reaches its EOI and its scans can hold the blocks its header declares."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
import torch
from PIL import Image

from service.codecs.device_images import jpeg_to_tensor
from service.codecs.images import open_image
from service.codecs.jpeg_check import _least_bytes, jpeg_is_complete
from service.errors import BadInput
from service.specs.model import PreprocessSpec
from service.zoo.lenet import samples_dir

OPTIONS = [{}, {"progressive": True}, {"optimize": True}, {"subsampling": 0}, {"progressive": True, "optimize": True}]


def encode(image: Image.Image, **options: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", **options)
    return buffer.getvalue()


def pictures() -> list[Image.Image]:
    """Noise (the most data per block), flat pictures (the least: one bit per block), odd sizes, every mode."""
    rng = np.random.default_rng(0)
    noise = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in ((1, 1), (7, 9), (120, 90))]
    flat = [Image.new("RGB", (1600, 1200)), Image.new("L", (1000, 999), 128), Image.new("CMYK", (64, 48))]
    digits = [Image.open(path).convert("RGB") for path in sorted(samples_dir().glob("*.png"))[:3]]
    return noise + flat + digits


@pytest.mark.parametrize("options", OPTIONS, ids=str)
@pytest.mark.parametrize("quality", [1, 10, 50, 75, 95, 100])
def test_whole_jpegs_are_complete(quality: int, options: dict[str, object]) -> None:
    for picture in pictures():
        data = encode(picture, quality=quality, **options)
        assert jpeg_is_complete(data), (picture.size, picture.mode)
        assert jpeg_is_complete(data + b"\x00" * 100)  # padding after the EOI


def declaring(width: int, height: int) -> bytes:
    data = bytearray(encode(Image.new("RGB", (16, 16), (200, 10, 10))))
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


@pytest.mark.parametrize("options", OPTIONS, ids=str)
def test_truncated_jpegs_are_not(options: dict[str, object]) -> None:
    data = encode(pictures()[2], quality=90, **options)
    for cut in (2, 20, len(data) // 2, len(data) - 1):
        assert not jpeg_is_complete(data[:cut])
    assert not jpeg_is_complete(b"")
    assert not jpeg_is_complete(b"\xff\xd8garbage")


def test_a_header_larger_than_its_data_is_refused_on_both_paths() -> None:
    """The issue's 631-byte JPEG: its header says 6000x6000, its EOI comes after 16x16 worth of data."""
    data = declaring(6000, 6000)
    assert len(data) < 700
    assert data.endswith(b"\xff\xd9")
    with Image.open(io.BytesIO(data)) as image:
        image.load()  # what PIL alone does: grey pixels, no error
        assert image.size == (6000, 6000)
    assert not jpeg_is_complete(data)
    assert jpeg_is_complete(declaring(16, 16))
    with pytest.raises(BadInput, match="truncated or corrupt"):
        open_image(data, 10**8)
    with pytest.raises(BadInput, match="truncated or corrupt"):
        jpeg_to_tensor(data, PreprocessSpec(), 3, 10**8, device=torch.device("cpu"))


def frame(height: int, width: int, factors: list[tuple[int, int]]) -> bytes:
    """A baseline frame header's body: precision, size, then (id, h << 4 | v, table) per component."""
    body = bytes([8]) + struct.pack(">HH", height, width) + bytes([len(factors)])
    return body + b"".join(bytes([i + 1, h << 4 | v, 0]) for i, (h, v) in enumerate(factors))


@pytest.mark.parametrize(
    ("factors", "blocks"),
    [
        ([(1, 1), (1, 1), (1, 1)], 64),  # 4:4:4: each component has 8 x 8 blocks
        ([(2, 2), (1, 1), (1, 1)], 64),  # 4:2:0: luma at full size, 8 x 8 blocks; chroma at half, 4 x 4
        ([(2, 1), (1, 1), (1, 1)], 64),  # 4:2:2
        ([(1, 1)], 64),  # gray
    ],
)
def test_the_least_scan_is_a_bit_per_block_of_the_largest_component(
    factors: list[tuple[int, int]], blocks: int
) -> None:
    """A 64 x 64 frame: every 8 x 8 block of its full-size component takes at least one bit of the scan."""
    assert _least_bytes(0xC0, frame(64, 64, factors)) == blocks // 8
