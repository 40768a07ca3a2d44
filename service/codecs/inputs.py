"""A request's inputs (images and tensors) into one batch tensor [N, C, H, W] for a model."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from service.codecs.device_images import is_jpeg, jpeg_to_tensor
from service.codecs.images import image_to_tensor
from service.codecs.preprocess import DEFAULT_MAX_PREPROCESSED_PIXELS
from service.codecs.tensors import decode_b64, tensor_from_payload
from service.errors import InvalidField, TooLarge
from service.registry.loaded import LoadedModel
from service.schemas.common import InputItem


def decode_batch(
    items: Sequence[InputItem],
    images: Sequence[bytes] | None,
    model: LoadedModel,
    max_pixels: int,
    max_preprocessed: int = DEFAULT_MAX_PREPROCESSED_PIXELS,
) -> torch.Tensor:
    """Decode every input and stack them. Runs on a thread pool, never on the event loop.

    `max_pixels` bounds each image (from its header) and each tensor's pixels per channel; `max_preprocessed`
    the images an image's preprocessing makes (from its header too). What a tensor of any shape costs in the
    model is bounded after this, from its exact layer shapes (`service.dataplane.shapes`)."""
    samples: list[torch.Tensor] = []
    if images is not None:
        for i, data in enumerate(images):
            samples.append(_image(data, model, (max_pixels, max_preprocessed), f"image[{i}]"))
    else:
        for i, item in enumerate(items):
            where = f"inputs[{i}]"
            if item.image is not None:
                data = decode_b64(item.image, f"{where}.image")
                samples.append(_image(data, model, (max_pixels, max_preprocessed), f"{where}.image"))
            elif item.tensor is not None:
                t = item.tensor
                tensor = tensor_from_payload(t.shape, t.dtype, t.data, t.b64, f"{where}.tensor")
                samples.append(_check_tensor(tensor, model, max_pixels, where))
    shapes = {tuple(s.shape) for s in samples}
    if len(shapes) > 1:
        raise InvalidField(f"inputs have different shapes {sorted(shapes)}; send one request per shape")
    return torch.stack(samples) if len(samples) > 1 else samples[0].unsqueeze(0)


def _image(data: bytes, model: LoadedModel, limits: tuple[int, int], where: str) -> torch.Tensor:
    """JPEGs for CUDA models are decoded on the GPU (nvJPEG); everything else through PIL. `limits`: the image's
    pixels, and those of any image its preprocessing makes."""
    max_pixels, max_preprocessed = limits
    if model.device.type == "cuda" and is_jpeg(data):
        return jpeg_to_tensor(
            data,
            model.preprocess,
            model.channels,
            max_pixels,
            device=model.device,
            where=where,
            max_preprocessed=max_preprocessed,
        )
    return image_to_tensor(data, model.preprocess, model.channels, max_pixels, where, max_preprocessed=max_preprocessed)


def _check_tensor(tensor: torch.Tensor, model: LoadedModel, max_pixels: int, where: str) -> torch.Tensor:
    expected = model.input_size
    if tensor.ndim != len(expected):
        raise InvalidField(
            f"{where}.tensor has shape {list(tensor.shape)}; {model.name} takes one sample of rank "
            f"{len(expected)} like {expected} (no batch dimension)"
        )
    if tensor.shape[0] != expected[0]:
        raise InvalidField(f"{where}.tensor has {tensor.shape[0]} channels; {model.name} needs {expected[0]}")
    pixels = tensor[0].numel()
    if tensor.ndim >= 3 and pixels > max_pixels:
        raise TooLarge(
            f"{where}.tensor has {pixels} pixels per channel, over the limit of {max_pixels} (max_image_pixels); "
            "send a smaller input"
        )
    if not tensor.is_floating_point():
        tensor = tensor.to(torch.float32)
    as_model = tensor if tensor.dtype == model.dtype else tensor.to(model.dtype)  # e.g. 1e300 overflows float32
    if not torch.isfinite(as_model).all():
        raise InvalidField(f"{where}.tensor holds NaN or infinite values (in the model's dtype {model.spec.dtype})")
    return tensor
