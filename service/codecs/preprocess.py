"""Image preprocessing: PIL image -> normalized float tensor [C, H, W].

Matches torchvision's `Resize(shorter side)` + `CenterCrop` on PIL images (PIL's resampling
filters are antialiased), then scaling to [0, 1] and per-channel normalization.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from service.config import Settings
from service.errors import TooLarge
from service.specs.model import Interpolation, PreprocessSpec

DEFAULT_MAX_PREPROCESSED_PIXELS: int = Settings.model_fields["max_preprocessed_pixels"].default

_PIL_FILTERS = {
    Interpolation.bilinear: Image.Resampling.BILINEAR,
    Interpolation.bicubic: Image.Resampling.BICUBIC,
    Interpolation.nearest: Image.Resampling.NEAREST,
}


def resized_size(width: int, height: int, shorter: int) -> tuple[int, int]:
    """New (width, height) with the shorter side equal to `shorter`, as torchvision computes it."""
    if width <= height:
        return shorter, int(shorter * height / width)
    return int(shorter * width / height), shorter


def center_crop_box(width: int, height: int, crop: int) -> tuple[int, int, int, int]:
    """PIL crop box of a centered `crop`×`crop` square (torchvision's rounding)."""
    top = round((height - crop) / 2.0)
    left = round((width - crop) / 2.0)
    return left, top, left + crop, top + crop


@dataclass(frozen=True)
class Step:
    """One preprocessing step's result: what it does and the image it makes (width x height)."""

    does: str
    width: int
    height: int

    @property
    def pixels(self) -> int:
        return self.width * self.height


def preprocessing_steps(width: int, height: int, spec: PreprocessSpec) -> list[Step]:
    """The image each step of `preprocess_image` makes from a `width` x `height` one, computed without pixels."""
    steps = [Step("decoding it", width, height)]
    if spec.resize is not None:
        width, height = resized_size(width, height, spec.resize)
        steps.append(Step(f"resizing its shorter side to {spec.resize}", width, height))
    if spec.crop is not None:
        if width < spec.crop or height < spec.crop:
            width, height = max(width, spec.crop), max(height, spec.crop)
            steps.append(Step(f"padding it to the {spec.crop}-pixel crop", width, height))
        steps.append(Step(f"cropping it to {spec.crop}x{spec.crop}", spec.crop, spec.crop))
    return steps


def check_preprocessing(width: int, height: int, spec: PreprocessSpec, max_pixels: int, where: str) -> None:
    """413 when a step of the model's preprocessing would make an image of more than `max_pixels` pixels, told
    from the header alone (a 1 x 100000 PNG resized to a shorter side of 256 would be 256 x 25600000)."""
    largest = max(preprocessing_steps(width, height, spec), key=lambda step: step.pixels)
    if largest.pixels <= max_pixels:
        return
    if spec.resize is not None:
        ratio = max(1, max_pixels // (spec.resize * spec.resize))
        way_out = f"send an image nearer to square (sides at most {ratio}:1 for this model; crop or pad it)"
    else:
        way_out = "send a smaller image"
    raise TooLarge(
        f"{where} is {width}x{height}; the model's preprocessing, {largest.does}, would make a "
        f"{largest.width}x{largest.height} image ({largest.pixels} pixels), over the limit of {max_pixels} "
        f"(max_preprocessed_pixels); {way_out}, or raise max_preprocessed_pixels"
    )


def preprocess_image(image: Image.Image, spec: PreprocessSpec, channels: int) -> torch.Tensor:
    """Return a float32 tensor [channels, H, W] ready for the model.

    `grayscale` converts to luminance first; a 1-channel result is repeated to `channels`
    (the digits LeNet wants 3 identical channels).
    """
    mode = "L" if spec.grayscale or channels == 1 else "RGB"
    if image.mode != mode:
        image = image.convert(mode)
    if spec.resize is not None:
        size = resized_size(image.width, image.height, spec.resize)
        if size != image.size:
            image = image.resize(size, _PIL_FILTERS[spec.interpolation])
    if spec.crop is not None:
        if image.width < spec.crop or image.height < spec.crop:
            # torchvision pads with zeros; do the same by pasting onto a black canvas
            canvas = Image.new(mode, (max(image.width, spec.crop), max(image.height, spec.crop)))
            canvas.paste(image, ((canvas.width - image.width) // 2, (canvas.height - image.height) // 2))
            image = canvas
        if image.size != (spec.crop, spec.crop):
            image = image.crop(center_crop_box(image.width, image.height, spec.crop))
    array = np.array(image, dtype=np.uint8)  # writable copy: torch.from_numpy refuses read-only views
    if array.ndim == 2:
        array = array[:, :, None]
    tensor = torch.from_numpy(array).permute(2, 0, 1).to(torch.float32).div_(255.0)
    if tensor.shape[0] == 1 and channels != 1:
        tensor = tensor.expand(channels, -1, -1)
    mean = per_channel(spec.mean, channels)
    std = per_channel(spec.std, channels)
    return tensor.sub(mean).div_(std).contiguous()


def per_channel(values: list[float], channels: int, device: torch.device | None = None) -> torch.Tensor:
    """Mean or std as a `[channels, 1, 1]` float32 tensor; fewer values than channels are repeated."""
    if len(values) != channels:
        values = (values * channels)[:channels]
    return torch.tensor(values, dtype=torch.float32, device=device).view(-1, 1, 1)


def denormalize(tensor: torch.Tensor, spec: PreprocessSpec) -> torch.Tensor:
    """Invert the normalization of a [C, H, W] tensor back to [0, 1] (for pictures)."""
    channels = tensor.shape[0]
    mean = per_channel(spec.mean, channels).to(tensor.device, tensor.dtype)
    std = per_channel(spec.std, channels).to(tensor.device, tensor.dtype)
    return (tensor * std + mean).clamp_(0.0, 1.0)
