"""Shared request parts: inputs, JSON tensors, formats."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from service.specs.vocab import TENSOR_DTYPES


class TensorPayload(BaseModel):
    """One already-preprocessed sample: `data` (nested or flat list) or `b64` (little-endian bytes)."""

    model_config = ConfigDict(extra="forbid")

    shape: list[int] = Field(..., max_length=8, examples=[[3, 32, 32]])
    dtype: str = Field("float32", description=f"One of {', '.join(TENSOR_DTYPES)}.")
    data: Any | None = Field(None, description="Numbers, nested to match shape or flat.")
    b64: str | None = Field(None, description="Base64 of the raw little-endian bytes.")

    @model_validator(mode="after")
    def _one_source(self) -> TensorPayload:
        if (self.data is None) == (self.b64 is None):
            raise ValueError("give exactly one of 'data' or 'b64'")
        return self


class InputItem(BaseModel):
    """One input: an encoded image (base64) or a tensor."""

    model_config = ConfigDict(extra="forbid")

    image: str | None = Field(None, description="Base64 of a PNG/JPEG/WebP/BMP file.")
    tensor: TensorPayload | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> InputItem:
        if (self.image is None) == (self.tensor is None):
            raise ValueError("each input needs exactly one of 'image' or 'tensor'")
        return self


class ModelInputs(BaseModel):
    """The fields every model-running request shares."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model: str = Field(..., description="A served model's name (GET /models lists them).", examples=["lenet"])
    inputs: list[InputItem] = Field(..., min_length=1)
    dry_run: bool = Field(
        False,
        description="Run nothing: answer 200 with what the request would cost (memory by part, forwards, "
        "seconds, rows per forward) and whether it would be admitted now.",
    )


class TensorJSON(BaseModel):
    """A tensor in a JSON answer."""

    shape: list[int]
    dtype: str
    data: Any = Field(..., description="Nested lists matching shape.")


class ErrorBody(BaseModel):
    detail: Any = Field(..., examples=["no model named 'foo'; GET /models lists them"])
