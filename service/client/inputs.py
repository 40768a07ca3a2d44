"""Inputs into request bodies: images as multipart files, tensors as base64 in JSON.

An input is an image (a path, the bytes of an image file, or a PIL image) or one
already-preprocessed sample (a NumPy array or torch tensor without the batch dim). A call
takes one input or a list; to send a batch array, pass `list(batch)`.

When every input is an image and the client is binary, the request is a multipart form:
the files travel as they are (no base64), as curl sends them. Otherwise it is JSON, with
images base64-encoded and tensors as base64 bytes (binary) or nested lists.
"""

from __future__ import annotations

import base64
import io
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias, TypeGuard

import numpy as np
from PIL import Image

from service.client.tensors import tensor_input

ImageInput: TypeAlias = "str | os.PathLike[str] | bytes | Image.Image"
Input: TypeAlias = "ImageInput | np.ndarray[Any, Any] | Any"  # Any: a torch tensor (torch is not imported here)
Inputs: TypeAlias = "Input | Sequence[Input]"


@dataclass(frozen=True)
class Body:
    """A request body: `json` or multipart (`data` fields + `files`)."""

    json: dict[str, Any] | None = None
    data: dict[str, str] | None = None
    files: list[tuple[str, tuple[str, bytes, str]]] | None = None

    def httpx_kwargs(self) -> dict[str, Any]:
        if self.json is not None:
            return {"json": self.json}
        return {"data": self.data, "files": self.files}


def as_list(inputs: Inputs) -> list[Input]:
    """One input or a sequence of them, as a list (a bare array is one sample, never a batch)."""
    if isinstance(inputs, (str, bytes, bytearray, os.PathLike, Image.Image, np.ndarray)) or _is_torch(inputs):
        return [inputs]
    if isinstance(inputs, Sequence):
        items = list(inputs)
        if not items:
            raise ValueError("no inputs: give at least one image or tensor")
        return items
    return [inputs]


def is_image(item: Input) -> TypeGuard[ImageInput]:
    return isinstance(item, (str, bytes, bytearray, os.PathLike, Image.Image))


def image_bytes(item: ImageInput) -> tuple[str, bytes]:
    """(file name, encoded bytes) of an image input; PIL images are encoded as PNG (lossless)."""
    if isinstance(item, Image.Image):
        buffer = io.BytesIO()
        item.save(buffer, format="PNG")
        return "image.png", buffer.getvalue()
    if isinstance(item, (bytes, bytearray)):
        return "image", bytes(item)
    path = Path(item)
    return path.name, path.read_bytes()


def build_body(model: str, inputs: Inputs, fields: Mapping[str, Any], *, binary: bool) -> Body:
    """The body of a model-running request (predict, activations, gradients, saliency)."""
    items = as_list(inputs)
    images = [item for item in items if is_image(item)]
    if binary and len(images) == len(items):
        files = []
        for image in images:
            name, content = image_bytes(image)
            files.append(("image", (name, content, _content_type(content))))
        data = {"model": model} | {key: form_value(value) for key, value in fields.items() if value is not None}
        return Body(data=data, files=files)
    encoded = [_json_input(item, binary) for item in items]
    return Body(json={"model": model, "inputs": encoded, **{k: v for k, v in fields.items() if v is not None}})


def json_inputs(inputs: Inputs) -> list[dict[str, Any]]:
    """Inputs as the JSON `inputs` list: images base64, tensors base64 bytes (donor runs of /interventions)."""
    return [_json_input(item, True) for item in as_list(inputs)]


def form_value(value: Any) -> str:
    """A JSON field as a multipart form value: booleans true/false, lists and objects as JSON."""
    import json

    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(list(value) if isinstance(value, tuple) else value)
    return str(value)


def _json_input(item: Input, binary: bool) -> dict[str, Any]:
    if is_image(item):
        _, content = image_bytes(item)
        return {"image": base64.b64encode(content).decode("ascii")}
    return tensor_input(item, binary=binary)


def _content_type(content: bytes) -> str:
    """The image type from its magic bytes (the server decodes by content; this is for proxies and logs)."""
    if content.startswith(b"\x89PNG"):
        return "image/png"
    if content.startswith(b"\xff\xd8"):
        return "image/jpeg"
    if content[:4] == b"RIFF" and content[8:12] == b"WEBP":
        return "image/webp"
    if content.startswith(b"BM"):
        return "image/bmp"
    return "application/octet-stream"


def _is_torch(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "detach")
