"""Model INFO, layers, and the admin load body."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from service.specs.model import ModelSpec, PreprocessSpec


class ModelInfo(BaseModel):
    """What `GET /models` lists for each model."""

    model_config = ConfigDict(protected_namespaces=())

    name: str = Field(..., examples=["lenet"])
    source: str = Field(..., examples=["python"])
    architecture: str = Field(..., examples=["service.zoo.lenet:LeNet"])
    status: str = Field(..., description="loading | ready | failed", examples=["ready"])
    error: str | None = None
    device: str | None = Field(None, examples=["cpu"])
    dtype: str = Field(..., examples=["float32"])
    memory_format: str = Field(
        ...,
        description='"channels_last" or "contiguous" once loaded; the configured value ("auto", ...) before.',
        examples=["channels_last"],
    )
    weights: str = Field(..., description='File name, "random" or "DEFAULT".', examples=["lenet_digits.pt"])
    num_parameters: int | None = None
    trainable_parameters: int | None = None
    input_size: list[int] | None = Field(None, examples=[[3, 32, 32]])
    preprocess: PreprocessSpec | None = None
    num_classes: int | None = Field(None, examples=[10])
    labels: bool = False
    optimizer: str | None = Field(None, examples=["SGD"])
    hooks: int = Field(0, description="Hooks registered on the model's modules right now; 0 between requests.")
    prediction_path: str | None = Field(
        None,
        description='What plain predictions run on: "fused" (a copy with BatchNorm folded), "compiled", '
        '"fused+compiled", or "eager" (the served module itself). Hooked requests always use the served module.',
        examples=["fused"],
    )
    load_seconds: float | None = None


class ModelDetail(ModelInfo):
    repr: str | None = Field(None, description="The text of print(model).")


class ModelList(BaseModel):
    models: list[ModelInfo]


class LoadModelRequest(ModelSpec):
    """One `[[models]]` entry as JSON."""

    model_config = ConfigDict(
        extra="forbid",
        protected_namespaces=(),
        json_schema_extra={"examples": [{"name": "resnet18b", "source": "torchvision", "architecture": "resnet18"}]},
    )


class Health(BaseModel):
    status: str = Field(..., examples=["ok"])
    models: dict[str, Any] | None = None
