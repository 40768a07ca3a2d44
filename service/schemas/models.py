"""Model INFO, layers, and the admin load body."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from service.schemas.tokens import TokenInfo
from service.specs.model import ModelSpec, PreprocessSpec


class AttentionInfo(BaseModel):
    """The attention modules POST /attention reads, their heads, and the tokens at the model's input size."""

    modules: list[str] = Field(..., examples=[["blocks.0.attn", "blocks.1.attn"]])
    heads: list[int] = Field(..., description="Heads of each module, in the same order.", examples=[[4, 4]])
    tokens: TokenInfo | None = None
    fused: bool | None = Field(
        None,
        description="Whether predictions run them on the fused kernel (scaled_dot_product_attention); null when "
        "predictions run elsewhere (ONNX Runtime). /attention unfuses them on a hook lane for its own batch only.",
    )


class CaptureSetInfo(BaseModel):
    """A capture set: these layers or these nodes (sorted), these sides, from samples of this shape."""

    layers: list[str] = Field(..., description="Modules ([] for a set of nodes).", examples=[["layer4"]])
    nodes: list[str] | None = Field(None, description="Functional nodes, for a set of nodes.", examples=[None])
    capture: str = Field(..., examples=["output"])
    sample_shape: list[int] = Field(..., examples=[[3, 224, 224]])
    reduce: str | None = Field(
        None, description="mean or max over the spatial dims, inside the plan's graph (null: none).", examples=[None]
    )


class CapturePlanInfo(CaptureSetInfo):
    forwards: int = Field(..., description="Batches the plan served.")


class CaptureFallbackInfo(CaptureSetInfo):
    reason: str = Field(
        ...,
        description="Why its captures stay on hooks.",
        examples=["FX cannot trace it (symbolically traced variables cannot be used as inputs to control flow)"],
    )


class CapturePlansInfo(BaseModel):
    """Forward-only captures on ONNX Runtime: a graph of the model with the captured values as extra outputs."""

    enabled: bool = Field(..., description="Whether the model's captures may run on plans.")
    reason: str | None = Field(
        None,
        description="Why they never do, when they do not.",
        examples=["predictions do not run on ONNX Runtime (not ONNX Runtime: it runs on cuda)"],
    )
    limit: int = Field(..., description="Plans kept (least recently used dropped first): capture_plans.")
    after_requests: int = Field(
        ..., description="Batches of a capture set served by hooks before its plan is built: plan_after_requests."
    )
    plans: list[CapturePlanInfo] = Field(..., description="The capture sets served by plans, most recently used last.")
    building: int = Field(..., description="Plans being built now, off the request path.")
    fallbacks: list[CaptureFallbackInfo] = Field(
        ..., description="Capture sets whose plan could not be built, each with the reason: hooks serve them."
    )
    planned_forwards: int = Field(..., description="Capture batches served by plans.")
    eager_forwards: int = Field(..., description="Capture batches served by hooks.")
    evicted: int = Field(..., description="Plans dropped to keep within the limit.")


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
    hooks: int = Field(
        0, description="Hooks registered on the model's modules and its hook lanes right now; 0 between requests."
    )
    prediction_path: str | None = Field(
        None,
        description='What plain predictions run on: "onnxruntime" (the model exported to ONNX Runtime), "fused" '
        '(a copy with BatchNorm folded), "compiled", "fused+compiled", or "eager" (the served module itself). '
        "Hooked requests always see the model as configured, never these copies.",
        examples=["onnxruntime"],
    )
    prediction_path_reason: str | None = Field(
        None,
        description="Why predictions do not take a faster path (ONNX Runtime, a fused copy), when they do not.",
        examples=["not ONNX Runtime: it runs on cuda"],
    )
    hook_lanes: int | None = Field(
        None,
        description="How many hooked batches (activations, gradients, saliency, interventions) may run at once: "
        "each on its own copy of the module tree, sharing the model's weights, with hooks of its own. 0: one at a "
        "time, on the served module (one worker thread, or a module that cannot be copied).",
        examples=[2],
    )
    packed_convolutions: bool | None = Field(
        None,
        description="Whether forwards on the model itself (hooked requests; predictions too when they run on it or "
        "on its fused copy) take Conv2d weights packed once for oneDNN: same kernel, bit-identical outputs, no "
        "weight reorder per call.",
        examples=[True],
    )
    packed_convolutions_reason: str | None = Field(
        None, description="Why they do not, when they do not.", examples=["it runs on cuda"]
    )
    attention: AttentionInfo | None = Field(
        None, description="A vision transformer's attention modules, which POST /attention reads; null otherwise."
    )
    attention_reason: str | None = Field(
        None,
        description="Why POST /attention refuses the model (no attention modules, or none whose probabilities "
        "hooks can read), when it does.",
        examples=["efficientvit_b0's attention does not expose probabilities. LiteMLA (...): ..."],
    )
    capture_plans: CapturePlansInfo | None = Field(
        None,
        description="Which forward-only captures (/activations layers and nodes, /v2 layer outputs, data-set jobs, "
        "the clean forward of /interventions) run on ONNX Runtime rather than by hooks, and why others do not; null "
        "until the model is ready.",
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
