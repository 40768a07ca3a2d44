"""Encoded images in: every common format decodes; bombs are refused from the header, before decoding."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
import torch
from PIL import Image, ImageFile

from service.codecs.images import image_to_tensor, open_image
from service.codecs.preprocess import preprocess_image
from service.errors import BadInput, TooLarge
from service.specs.model import PreprocessSpec

LIMIT = 40_000_000


def encode(image: Image.Image, fmt: str, **options: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def png_declaring(width: int, height: int) -> bytes:
    """A tiny real PNG whose IHDR is patched to claim `width`×`height` (a decompression bomb)."""
    data = bytearray(encode(Image.new("RGB", (4, 4), (255, 0, 0)), "PNG"))
    assert data[12:16] == b"IHDR"
    data[16:24] = struct.pack(">II", width, height)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    return bytes(data)


@pytest.fixture(scope="module")
def picture() -> Image.Image:
    """A smooth 30×20 picture (lossy codecs keep it close), distinct per channel."""
    y, x = np.mgrid[0:20, 0:30]
    return Image.fromarray(np.stack([x * 8, y * 12, 255 - x * 4 - y * 3], axis=-1).astype(np.uint8))


@pytest.mark.parametrize(
    ("fmt", "options", "lossless"),
    [
        ("PNG", {}, True),
        ("BMP", {}, True),
        ("WEBP", {"lossless": True}, True),
        ("WEBP", {"quality": 80}, False),
        ("JPEG", {"quality": 90}, False),
        ("TIFF", {}, True),
    ],
)
def test_common_formats_decode(picture: Image.Image, fmt: str, options: dict[str, object], lossless: bool) -> None:
    image = open_image(encode(picture, fmt, **options), LIMIT)
    assert image.size == (30, 20)
    pixels = np.asarray(image.convert("RGB"), dtype=np.int16)
    original = np.asarray(picture, dtype=np.int16)
    if lossless:
        assert np.array_equal(pixels, original)
    else:
        assert np.abs(pixels - original).mean() < 6  # same picture, lossy codec


def test_patched_png_really_declares_the_bomb_size() -> None:
    with Image.open(io.BytesIO(png_declaring(30000, 30000))) as image:
        assert image.size == (30000, 30000)


def test_bomb_is_refused_before_any_pixel_is_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    decoded: list[object] = []
    original_load = ImageFile.ImageFile.load

    def spy(self: ImageFile.ImageFile) -> object:
        decoded.append(self)
        return original_load(self)

    monkeypatch.setattr(ImageFile.ImageFile, "load", spy)
    with pytest.raises(TooLarge) as info:
        open_image(png_declaring(30000, 30000), LIMIT, "inputs[0].image")
    assert info.value.status == 413
    detail = str(info.value.detail)
    assert "inputs[0].image is 30000x30000 = 900000000 pixels" in detail
    assert "max_image_pixels" in detail
    assert decoded == []
    open_image(encode(Image.new("L", (4, 4)), "PNG"), LIMIT)  # the spy does see ordinary decodes
    assert len(decoded) == 1


def test_one_pixel_wide_or_high_images_open() -> None:
    for size in ((1, 7), (7, 1), (1, 1)):
        assert open_image(encode(Image.new("L", size, 128), "PNG"), LIMIT).size == size


def test_limit_is_inclusive(picture: Image.Image) -> None:
    data = encode(picture, "PNG")
    assert open_image(data, 600).size == (30, 20)
    with pytest.raises(TooLarge, match="over the limit of 599"):
        open_image(data, 599)


@pytest.mark.parametrize("data", [b"", b"hello, world", b"\x89PNG\r\n\x1a\n" + b"\0" * 10, b"GIF89a"])
def test_not_an_image_is_400(data: bytes) -> None:
    with pytest.raises(BadInput, match="image\\[2\\] is not a decodable image") as info:
        open_image(data, LIMIT, "image[2]")
    assert info.value.status == 400


def test_truncated_image_is_400(picture: Image.Image) -> None:
    data = encode(picture, "PNG")
    with pytest.raises(BadInput, match="could not be decoded"):
        open_image(data[: len(data) // 2], LIMIT)


def test_image_to_tensor_is_open_then_preprocess(picture: Image.Image) -> None:
    spec = PreprocessSpec(resize=16, crop=12)
    data = encode(picture, "PNG")
    got = image_to_tensor(data, spec, 3, LIMIT)
    assert got.shape == (3, 12, 12)
    assert torch.equal(got, preprocess_image(picture, spec, 3))
