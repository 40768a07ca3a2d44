"""POST /attention: the attention probabilities of a vision transformer's blocks."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from service.schemas.common import ModelInputs
from service.schemas.examples import SAMPLE_INPUTS
from service.schemas.predict import Prediction
from service.schemas.tokens import Index, QueryChoice, TokenInfo
from service.specs.vocab import ActivationFormat


class AttentionRequest(ModelInputs):
    model_config = ConfigDict(
        extra="forbid",
        protected_namespaces=(),
        json_schema_extra={
            "examples": [
                {"model": "vit_digits", "inputs": SAMPLE_INPUTS, "blocks": ["blocks.3"]},
                {"model": "vit_digits", "inputs": SAMPLE_INPUTS, "blocks": ["blocks.*"], "format": "png"},
            ]
        },
    )

    blocks: list[str] = Field(
        default_factory=list,
        description="Attention modules, or the blocks holding them, by module path or fnmatch pattern "
        "(`blocks.3`, `blocks.3.attn`, `blocks.*`); default every attention module (at most max_layers).",
    )
    heads: list[Index] | None = Field(None, min_length=1, description="Head indices; default every head.")
    queries: QueryChoice | None = None
    format: ActivationFormat = Field(
        ActivationFormat.json,
        description="json | stats | safetensors | npz | png (the first input's maps over it: a row per block, "
        "a column per head, from the first query row over the patch tokens).",
    )
    alpha: float = Field(0.5, ge=0.0, le=1.0, description="png: the maps' opacity over the image.")


class AttentionResponse(BaseModel):
    model_config = ConfigDict(protected_namespaces=())

    model: str
    tokens: TokenInfo | None = Field(None, description="The inputs' tokens; null when the model has no patch grid.")
    heads: list[int] = Field(..., description="The heads answered, in the order of dim 1.")
    queries: list[int] = Field(..., description="The query rows answered, in the order of dim 2.")
    query_names: list[str] = Field(..., description="Their names: `cls`, `dist`, `reg0`, `r<row>c<col>`.")
    attention: dict[str, Any] = Field(
        ...,
        description='`{"<attention module>": TENSOR [N, heads, queries, T]}`, softmax probabilities (each row '
        "over the T keys sums to 1); with format=stats each TENSOR is stats.",
    )
    predictions: list[Prediction] | None = Field(None, description="Top-5 of the same forward, for class scores.")
