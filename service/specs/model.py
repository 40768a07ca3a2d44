"""The model spec: one `[[models]]` entry of the models TOML (also the body of POST /models)."""

from __future__ import annotations

import re
import tomllib
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from service.errors import InvalidField

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"


class Source(StrEnum):
    torchvision = "torchvision"
    timm = "timm"
    python = "python"
    torchscript = "torchscript"  # architecture: a TorchScript file under the model dir (torch.jit.save's)


class DType(StrEnum):
    float32 = "float32"
    float16 = "float16"
    bfloat16 = "bfloat16"


class MemoryFormat(StrEnum):
    """How 4-D weights and inputs are laid out in memory."""

    auto = "auto"  # channels_last for convolutional image models, else contiguous
    channels_last = "channels_last"
    contiguous = "contiguous"


class Interpolation(StrEnum):
    bilinear = "bilinear"
    bicubic = "bicubic"
    nearest = "nearest"


class PreprocessSpec(BaseModel):
    """How an image becomes a tensor: resize shorter side, center crop, scale, normalize."""

    model_config = ConfigDict(extra="forbid")

    resize: int | None = Field(256, ge=1, le=8192, description="Shorter side after resizing; null = keep.")
    crop: int | None = Field(224, ge=1, le=8192, description="Center crop size; null = no crop.")
    interpolation: Interpolation = Interpolation.bilinear
    mean: list[float] = Field(default_factory=lambda: [0.485, 0.456, 0.406], min_length=1, max_length=4)
    std: list[float] = Field(default_factory=lambda: [0.229, 0.224, 0.225], min_length=1, max_length=4)
    grayscale: bool = False

    @field_validator("std")
    @classmethod
    def _positive_std(cls, v: list[float]) -> list[float]:
        if any(s <= 0 for s in v):
            raise ValueError("std values must be positive")
        return v


class OptimizerSpec(BaseModel):
    """`[models.optimizer]`: a torch.optim class name and its keyword arguments."""

    model_config = ConfigDict(extra="allow")

    type: str = Field("SGD", description="Any torch.optim optimizer class name.")

    def kwargs(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class ModelSpec(BaseModel):
    """One model: where its architecture and weights come from and how it is served."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    name: str = Field(..., pattern=NAME_PATTERN, examples=["resnet18"])
    source: Source = Field(..., examples=["torchvision"])
    architecture: str = Field(..., min_length=1, max_length=256, examples=["resnet18"])
    weights: str | None = Field(None, description='File under the model dir, "DEFAULT", or null (random).')
    kwargs: dict[str, Any] = Field(default_factory=dict)
    labels: str | None = Field(None, description="Labels file under the model dir, one per line.")
    input_size: list[int] | None = Field(None, min_length=1, max_length=4)
    device: str | None = Field(None, description="auto | cpu | cuda | cuda:N | mps; default the server's.")
    dtype: DType = DType.float32
    preprocess: PreprocessSpec | None = None
    optimizer: OptimizerSpec | None = None
    max_batch_size: int | None = Field(None, ge=1, le=1024)
    max_batch_delay_ms: float | None = Field(None, ge=0, le=10_000)
    compile: bool = Field(False, description="torch.compile the prediction path (off by default).")
    onnxruntime: bool | None = Field(
        None,
        description="Plain predictions of a float32 CPU model run on ONNX Runtime when its forward exports to ONNX "
        "and the runtime's outputs stay within 1e-4 of the model's (the runtime holds its own copy of the "
        "weights); unset: the server's `onnxruntime` setting. Hooks always see the model as it is.",
    )
    packed_convolutions: bool | None = Field(
        None,
        description="Forwards on the model itself (hooked requests, and predictions that run on it or on its fused "
        "copy) take Conv2d weights packed once for oneDNN instead of reordered on every call, when the outputs "
        "stay bit-identical (float32 channels_last CPU models; an extra copy of the convolution weights); unset: "
        "the server's `packed_convolutions` setting.",
    )
    fuse: bool = Field(
        True,
        description="Predictions run on a copy with BatchNorm folded into the convolutions before it when that "
        "copy's logits stay within 1e-4 of the model's; hooks always see the model as it is.",
    )
    batch_introspection: bool = Field(
        True,
        description="Batch concurrent activations, gradients and saliency requests into one forward; set false "
        "when the model's forward couples the samples of a batch.",
    )
    memory_format: MemoryFormat = Field(
        MemoryFormat.auto,
        description="auto (channels_last for convolutional image models: faster on CPU and CUDA) | "
        "channels_last | contiguous.",
    )

    @field_validator("input_size")
    @classmethod
    def _positive_sizes(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and any(s <= 0 for s in v):
            raise ValueError("input_size values must be positive")
        return v


def parse_specs(data: dict[str, Any]) -> list[ModelSpec]:
    """Validate a parsed TOML document; names must be unique."""
    raw = data.get("models", [])
    if not isinstance(raw, list):
        raise InvalidField("models config: [[models]] must be an array of tables")
    try:
        specs = [ModelSpec.model_validate(item) for item in raw]
    except ValidationError as exc:
        raise InvalidField(f"models config: {exc.errors(include_url=False)}") from None
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            raise InvalidField(f"models config: duplicate model name {spec.name!r}")
        seen.add(spec.name)
    return specs


def load_specs(path: Path) -> list[ModelSpec]:
    """Read the models TOML file."""
    with path.open("rb") as f:
        return parse_specs(tomllib.load(f))


def is_url_safe(name: str) -> bool:
    return re.match(NAME_PATTERN, name) is not None
