"""POST /activations."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from service.schemas.common import ModelInputs
from service.schemas.predict import Prediction
from service.specs.vocab import ActivationFormat, Capture, Reduce


class ActivationsRequest(ModelInputs):
    model_config = ConfigDict(
        extra="forbid",
        protected_namespaces=(),
        json_schema_extra={
            "examples": [
                {
                    "model": "lenet",
                    "inputs": [{"image": "<base64 PNG>"}],
                    "layers": ["conv1", "fc*"],
                    "capture": "output",
                    "reduce": None,
                    "format": "json",
                }
            ]
        },
    )

    layers: list[str] = Field(..., min_length=1, description="Module paths from /layers, or fnmatch patterns.")
    capture: Capture = Field(Capture.output, description="output | input | both")
    reduce: Reduce | None = Field(None, description="mean/max over spatial dims ([N, C]), or flatten ([N, -1]).")
    format: ActivationFormat = Field(ActivationFormat.json, description="json | stats | safetensors | npz | png")
    channels: int = Field(64, ge=1, le=1024, description="png: at most this many channels in the grid.")
    png_layer: str | None = Field(None, description="png: which captured layer to draw (default the first).")


class ActivationsResponse(BaseModel):
    model_config = ConfigDict(protected_namespaces=())

    model: str
    activations: dict[str, dict[str, Any]] = Field(
        ..., description='`{"<layer>": {"output": TENSOR, "input": TENSOR}}`; with format=stats each TENSOR is stats.'
    )
    predictions: list[Prediction] | None = Field(None, description="Top-5 of the same forward, for class scores.")
