"""POST /activations."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from service.schemas.common import ModelInputs
from service.schemas.examples import SAMPLE_INPUTS
from service.schemas.predict import Prediction
from service.schemas.tokens import TokenChoice, TokenInfo
from service.specs.vocab import ActivationFormat, Capture, Reduce


class ActivationsRequest(ModelInputs):
    model_config = ConfigDict(
        extra="forbid",
        protected_namespaces=(),
        json_schema_extra={
            "examples": [
                {
                    "model": "lenet",
                    "inputs": SAMPLE_INPUTS,
                    "layers": ["conv1", "fc*"],
                    "capture": "output",
                    "reduce": None,
                    "format": "json",
                }
            ]
        },
    )

    layers: list[str] = Field([], min_length=1, description="Module paths from /layers, or fnmatch patterns.")
    nodes: list[str] = Field(
        [],
        description=(
            "FX graph nodes from /models/{name}/nodes (torchvision's names, e.g. `layer1.0.add`), or fnmatch "
            "patterns: functional code that module hooks miss. Each gives its output, keyed by node name, after "
            "the layers' keys. `layers`, `nodes` or both; at most max_layers names in all."
        ),
        examples=[["layer1.0.add", "flatten"]],
    )
    capture: Capture = Field(Capture.output, description="output | input | both")
    reduce: Reduce | None = Field(None, description="mean/max over spatial dims ([N, C]), or flatten ([N, -1]).")
    tokens: TokenChoice | None = Field(
        None,
        description="A vision transformer's tokens to keep along dim 1 of its [N, T, D] layer outputs: indices in "
        "the whole sequence (0 is the class token), `patches` or `prefix`. Every captured layer must give tokens.",
    )
    format: ActivationFormat = Field(ActivationFormat.json, description="json | stats | safetensors | npz | png")
    channels: int = Field(64, ge=1, le=1024, description="png: at most this many channels in the grid.")
    png_layer: str | None = Field(None, description="png: which captured layer to draw (default the first).")

    @model_validator(mode="after")
    def _names_sites(self) -> ActivationsRequest:
        """At least one layer or node; an input-only capture needs layers (nodes record their outputs)."""
        if not self.layers and not self.nodes:
            raise ValueError("name at least one layer (GET /models/{name}/layers) or node (GET /models/{name}/nodes)")
        if self.tokens is not None and self.nodes:
            raise ValueError("tokens choose along the outputs of layers; capture nodes in a request of their own")
        if self.capture is Capture.input and not self.layers:
            raise ValueError(
                "capture=input records the inputs of layers; nodes record their outputs "
                "(a node's inputs are the outputs of the nodes /nodes lists as its `inputs`)"
            )
        return self


class ChosenTokens(TokenInfo):
    indices: list[int] = Field(..., description="The tokens kept, in the order of dim 1.")
    names: list[str] = Field(..., description="Their names: `cls`, `dist`, `reg0`, `r<row>c<col>`.")


class ActivationsResponse(BaseModel):
    model_config = ConfigDict(protected_namespaces=())

    model: str
    activations: dict[str, dict[str, Any]] = Field(
        ..., description='`{"<layer>": {"output": TENSOR, "input": TENSOR}}`; with format=stats each TENSOR is stats.'
    )
    predictions: list[Prediction] | None = Field(None, description="Top-5 of the same forward, for class scores.")
    tokens: ChosenTokens | None = Field(None, description="With `tokens`: which were kept, in the order of dim 1.")
