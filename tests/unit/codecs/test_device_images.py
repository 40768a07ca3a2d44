"""The on-device JPEG path agrees with the PIL reference path (run here on the CPU)."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image
from skimage import data as skdata

from service.codecs.device_images import is_jpeg, jpeg_to_tensor, preprocess_tensor
from service.codecs.preprocess import preprocess_image
from service.errors import BadInput, TooLarge
from service.specs.model import PreprocessSpec

CPU = torch.device("cpu")


def _jpeg(array: np.ndarray, quality: int = 95) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("spec", "channels"),
    [
        (PreprocessSpec(), 3),
        (PreprocessSpec(resize=235, crop=224, interpolation="bicubic"), 3),
        (PreprocessSpec(resize=32, crop=32, grayscale=True, mean=[0.3], std=[0.3]), 3),
    ],
)
def test_matches_pil_path_within_resampling_rounding(spec: PreprocessSpec, channels: int) -> None:
    jpeg = _jpeg(skdata.chelsea())
    reference = preprocess_image(Image.open(io.BytesIO(jpeg)), spec, channels)
    got = jpeg_to_tensor(jpeg, spec, channels, 10**8, device=CPU)
    assert got.shape == reference.shape
    # libjpeg-turbo (torchvision) and PIL's libjpeg may differ by an intensity step; antialias kernels match
    assert (got - reference).abs().mean().item() < 0.02


def test_small_image_is_padded_like_pil() -> None:
    spec = PreprocessSpec(resize=None, crop=64)
    image = torch.full((3, 40, 50), 200, dtype=torch.uint8)
    out = preprocess_tensor(image, spec, 3)
    assert out.shape == (3, 64, 64)
    reference = preprocess_image(Image.fromarray(image.permute(1, 2, 0).numpy()), spec, 3)
    torch.testing.assert_close(out, reference)


def test_pixel_limit_is_checked_from_the_header() -> None:
    with pytest.raises(TooLarge):
        jpeg_to_tensor(_jpeg(skdata.chelsea()), PreprocessSpec(), 3, 1000, device=CPU)


def test_corrupt_jpeg_is_bad_input() -> None:
    jpeg = _jpeg(skdata.chelsea())
    assert is_jpeg(jpeg)
    assert not is_jpeg(b"\x89PNG\r\n")
    with pytest.raises(BadInput):
        jpeg_to_tensor(jpeg[:200], PreprocessSpec(), 3, 10**8, device=CPU)


def test_the_device_path_checks_the_header_before_decoding() -> None:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 4000)).save(buffer, format="JPEG")
    spec = PreprocessSpec(resize=32, crop=32)
    with pytest.raises(TooLarge, match="max_preprocessed_pixels"):
        jpeg_to_tensor(buffer.getvalue(), spec, 3, 10**8, device=CPU, max_preprocessed=100_000)
    assert jpeg_to_tensor(buffer.getvalue(), spec, 3, 10**8, device=CPU).shape == (3, 32, 32)
