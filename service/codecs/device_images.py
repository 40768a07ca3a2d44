"""JPEG decode and preprocessing on the model's device (nvJPEG on CUDA), for GPU-served models.

The same steps as `service.codecs.preprocess` (shorter-side antialiased resize, center crop,
scale, normalize) on uint8 tensors with torchvision's functional ops, so the CPU never
touches the pixels. The PIL path stays the reference; this one agrees with it to within
resampling rounding.
"""

from __future__ import annotations

import io

import torch
from PIL import Image, UnidentifiedImageError
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.transforms import InterpolationMode
from torchvision.transforms.v2 import functional as F

from service.codecs.jpeg_check import jpeg_is_complete
from service.codecs.preprocess import (
    DEFAULT_MAX_PREPROCESSED_PIXELS,
    center_crop_box,
    check_preprocessing,
    per_channel,
    resized_size,
)
from service.errors import BadInput, TooLarge
from service.specs.model import Interpolation, PreprocessSpec

_MODES = {
    Interpolation.bilinear: InterpolationMode.BILINEAR,
    Interpolation.bicubic: InterpolationMode.BICUBIC,
    Interpolation.nearest: InterpolationMode.NEAREST,
}


def is_jpeg(data: bytes) -> bool:
    return data[:3] == b"\xff\xd8\xff"


def jpeg_to_tensor(
    data: bytes,
    spec: PreprocessSpec,
    channels: int,
    max_pixels: int,
    *,
    device: torch.device,
    where: str = "image",
    max_preprocessed: int = DEFAULT_MAX_PREPROCESSED_PIXELS,
) -> torch.Tensor:
    """Decode a JPEG on `device` and preprocess it there; the pixel limits (the image's and its preprocessing's)
    are checked from the header first."""
    try:
        width, height = Image.open(io.BytesIO(data)).size  # reads the header only
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
        raise BadInput(f"{where} is not a decodable JPEG") from None
    if width * height > max_pixels:
        raise TooLarge(f"{where} is {width}x{height} = {width * height} pixels, over the limit of {max_pixels}")
    check_preprocessing(width, height, spec, max_preprocessed, where)
    if not jpeg_is_complete(data):  # nvJPEG, like libjpeg, would fill the missing blocks with grey
        raise BadInput(f"{where} could not be decoded (truncated or corrupt JPEG)")
    gray = spec.grayscale or channels == 1
    raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    try:
        image = decode_jpeg(raw, mode=ImageReadMode.GRAY if gray else ImageReadMode.RGB, device=device)
    except RuntimeError:
        raise BadInput(f"{where} could not be decoded (truncated or corrupt JPEG)") from None
    return preprocess_tensor(image, spec, channels)


def preprocess_tensor(image: torch.Tensor, spec: PreprocessSpec, channels: int) -> torch.Tensor:
    """uint8 `[C, H, W]` on any device -> normalized float32 `[channels, crop, crop]` on that device."""
    height, width = int(image.shape[-2]), int(image.shape[-1])
    if spec.resize is not None:
        new_w, new_h = resized_size(width, height, spec.resize)
        if (new_w, new_h) != (width, height):
            image = F.resize(image, [new_h, new_w], interpolation=_MODES[spec.interpolation], antialias=True)
            height, width = new_h, new_w
    if spec.crop is not None:
        if width < spec.crop or height < spec.crop:
            image = F.center_crop(image, [spec.crop, spec.crop])  # pads with zeros like the PIL path
        else:
            left, top, _, _ = center_crop_box(width, height, spec.crop)
            image = image[..., top : top + spec.crop, left : left + spec.crop]
    tensor = image.to(torch.float32).div_(255.0)
    if tensor.shape[0] == 1 and channels != 1:
        tensor = tensor.expand(channels, -1, -1)
    mean = per_channel(spec.mean, channels, tensor.device)
    std = per_channel(spec.std, channels, tensor.device)
    return tensor.sub(mean).div_(std).contiguous()
