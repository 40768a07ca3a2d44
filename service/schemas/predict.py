"""POST /predict."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from service.schemas.common import ModelInputs
from service.schemas.examples import SAMPLE_INPUTS


class PredictRequest(ModelInputs):
    model_config = ConfigDict(
        extra="forbid",
        protected_namespaces=(),
        json_schema_extra={
            "examples": [
                {
                    "model": "lenet",
                    "inputs": SAMPLE_INPUTS,
                    "top_k": 3,
                }
            ]
        },
    )

    top_k: int = Field(5, ge=1, le=1000, description="How many classes per input.")
    include_logits: bool = Field(False, description="Also return every logit per input.")


class ClassScore(BaseModel):
    index: int = Field(..., examples=[7])
    label: str = Field(..., examples=["7"])
    score: float = Field(..., description="Softmax probability.", examples=[0.998])


class Prediction(BaseModel):
    top_k: list[ClassScore]
    logits: list[float] | None = None


class PredictResponse(BaseModel):
    model_config = ConfigDict(protected_namespaces=())

    model: str
    predictions: list[Prediction]
