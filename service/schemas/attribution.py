"""POST /gradients and POST /saliency."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from service.introspection.saliency import SaliencyMethod
from service.schemas.common import ModelInputs
from service.specs.vocab import SaliencyFormat, TensorFormat

# Strict: JSON `true` or `3.0` is a client's mistake (422), not silently class 1 or 3.
TargetItem = StrictInt | StrictStr
TargetField = TargetItem | list[TargetItem] | None
TARGET_DESCRIPTION = "Class index, label, a list with one per input, or null for each input's top-1."


class GradientsRequest(ModelInputs):
    model_config = ConfigDict(
        extra="forbid",
        protected_namespaces=(),
        json_schema_extra={
            "examples": [{"model": "lenet", "inputs": [{"image": "<base64 PNG>"}], "target": 7, "layers": ["conv2"]}]
        },
    )

    target: TargetField = Field(None, description=TARGET_DESCRIPTION)
    layers: list[str] = Field(default_factory=list, description="Module paths or fnmatch patterns.")
    include_input: bool = Field(True, description="Also d(score)/d(input); false leaves the `input` key out.")
    format: TensorFormat = TensorFormat.json


class GradientsResponse(BaseModel):
    model_config = ConfigDict(protected_namespaces=())

    model: str
    targets: list[int]
    scores: list[float] = Field(..., description="The target logits (the differentiated quantity).")
    gradients: dict[str, Any] = Field(..., description='`{"<layer>": TENSOR, "input": TENSOR}`')


class Baseline(StrEnum):
    zeros = "zeros"


class SaliencyRequest(ModelInputs):
    model_config = ConfigDict(
        extra="forbid",
        protected_namespaces=(),
        json_schema_extra={
            "examples": [
                {"model": "lenet", "inputs": [{"image": "<base64 PNG>"}], "method": "gradcam", "format": "png"}
            ]
        },
    )

    method: SaliencyMethod = Field(SaliencyMethod.GRADIENT, description="The attribution method (Captum's).")
    target: TargetField = Field(None, description=TARGET_DESCRIPTION)
    layer: str | None = Field(None, description="gradcam: the layer (default the last Conv2d).")
    steps: int = Field(50, ge=1, description="integrated_gradients: n_steps (limit max_ig_steps).")
    baseline: Baseline = Field(Baseline.zeros, description="integrated_gradients baseline.")
    samples: int = Field(25, ge=1, description="smoothgrad: nt_samples (limit max_smoothgrad_samples).")
    noise: float = Field(0.15, ge=0.0, le=10.0, description="smoothgrad: stdev as a fraction of x.max() - x.min().")
    seed: int = Field(0, ge=0, le=2**63 - 1, description="smoothgrad: the same seed gives the same map.")
    format: SaliencyFormat = SaliencyFormat.json
    alpha: float = Field(0.5, ge=0.0, le=1.0, description="png: heatmap opacity over the image.")


class SaliencyResult(BaseModel):
    target: int
    label: str
    score: float = Field(..., description="The target's logit.")
    probability: float = Field(..., description="The target's softmax probability.")
    attribution: Any = Field(..., description="TENSOR with the sample's own shape ([C, H, W]; [h, w] for gradcam).")
    heatmap: Any = Field(..., description="TENSOR [H, W] in [0, 1].")
    convergence_delta: float | None = Field(None, description="integrated_gradients only.")


class SaliencyResponse(BaseModel):
    model_config = ConfigDict(protected_namespaces=())

    model: str
    method: SaliencyMethod
    results: list[SaliencyResult]
