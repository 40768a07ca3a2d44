"""POST /gradients and POST /saliency."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from service.schemas.common import ModelInputs
from service.schemas.examples import SAMPLE_INPUTS
from service.schemas.tokens import TokenInfo
from service.specs.vocab import SaliencyFormat, TensorFormat

# Strict: JSON `true` or `3.0` is a client's mistake (422), not silently class 1 or 3.
TargetItem = StrictInt | StrictStr
TargetField = TargetItem | list[TargetItem] | None
TARGET_DESCRIPTION = "Class index, label, a list with one per input, or null for each input's top-1."


class GradientsRequest(ModelInputs):
    model_config = ConfigDict(
        extra="forbid",
        protected_namespaces=(),
        json_schema_extra={"examples": [{"model": "lenet", "inputs": SAMPLE_INPUTS, "target": 7, "layers": ["conv2"]}]},
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


class SaliencyCommon(ModelInputs):
    """The /saliency fields every method shares; each method adds its own (see `service.introspection.attribution`)."""

    target: TargetField = Field(None, description=TARGET_DESCRIPTION)
    format: SaliencyFormat = SaliencyFormat.json
    alpha: float = Field(0.5, ge=0.0, le=1.0, description="png: heatmap opacity over the image.")


class SaliencyResult(BaseModel):
    target: int
    label: str
    score: float = Field(..., description="The target's logit.")
    probability: float = Field(..., description="The target's softmax probability.")
    attribution: Any = Field(
        ...,
        description="TENSOR with the sample's own shape ([C, H, W]; [h, w] for gradcam; the layer's output "
        "shape for layer_conductance and layer_integrated_gradients).",
    )
    heatmap: Any = Field(..., description="TENSOR [H, W] in [0, 1] ([1, L] for a layer without spatial dims).")
    convergence_delta: float | None = Field(
        None, description="integrated_gradients, deeplift, layer_conductance and layer_integrated_gradients."
    )
    tokens: TokenInfo | None = Field(
        None,
        description="A map over a vision transformer's patch grid (attention_rollout, gradient_weighted_attention, "
        "a layer method at a token layer): the tokens, whose prefix tokens the map leaves out.",
    )


class SaliencyResponse(BaseModel):
    model_config = ConfigDict(protected_namespaces=())

    model: str
    method: str = Field(..., examples=["gradcam"])
    results: list[SaliencyResult]
