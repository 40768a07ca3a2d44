"""Encoded images in: header checks against the pixel limits (the image's, and those of the images its
preprocessing will make), then decode and preprocess."""

from __future__ import annotations

import io
from collections.abc import Callable

import torch
from PIL import Image, UnidentifiedImageError

from service.codecs.jpeg_check import jpeg_is_complete
from service.codecs.preprocess import DEFAULT_MAX_PREPROCESSED_PIXELS, check_preprocessing, preprocess_image
from service.errors import BadInput, TooLarge
from service.specs.model import PreprocessSpec

# We enforce our own (configurable) limit from the header, before any pixel is decoded.
Image.MAX_IMAGE_PIXELS = None


def open_image(
    data: bytes, max_pixels: int, where: str = "image", before_decoding: Callable[[int, int], None] | None = None
) -> Image.Image:
    """Open and fully decode an image; refuse oversize ones from their header alone (`before_decoding(width,
    height)`: further checks on the header's size, before any pixel is decoded)."""
    # PIL's own bomb check is off (MAX_IMAGE_PIXELS None): it never warns here, so no thread-unsafe
    # `warnings.catch_warnings()` around it; a DecompressionBombError comes only from code that resets the limit.
    try:
        image = Image.open(io.BytesIO(data))
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
        raise BadInput(f"{where} is not a decodable image (PNG, JPEG, WebP, BMP, ...)") from None
    except Image.DecompressionBombError:
        raise TooLarge(f"{where} declares more than the {max_pixels}-pixel limit") from None
    width, height = image.size
    if width * height > max_pixels:
        raise TooLarge(
            f"{where} is {width}x{height} = {width * height} pixels, over the limit of "
            f"{max_pixels} (max_image_pixels); send a smaller image"
        )
    if width == 0 or height == 0:
        raise BadInput(f"{where} has no pixels")
    if before_decoding is not None:
        before_decoding(width, height)
    if image.format in ("JPEG", "MPO") and not jpeg_is_complete(data):  # libjpeg would fill it with grey
        raise BadInput(f"{where} could not be decoded (truncated or corrupt)")
    try:
        image.load()
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        raise BadInput(f"{where} could not be decoded (truncated or corrupt)") from None
    return image


def image_to_tensor(
    data: bytes,
    spec: PreprocessSpec,
    channels: int,
    max_pixels: int,
    where: str = "image",
    *,
    max_preprocessed: int = DEFAULT_MAX_PREPROCESSED_PIXELS,
) -> torch.Tensor:
    """Decode + preprocess one image into the model's float32 [C, H, W] input; every preprocessing step's size
    is checked against `max_preprocessed` from the header, before decoding."""

    def bounded(width: int, height: int) -> None:
        check_preprocessing(width, height, spec, max_preprocessed, where)

    image = open_image(data, max_pixels, where, bounded)
    return preprocess_image(image, spec, channels)
