"""TorchServe's answers as its APIs document them (for the OpenAPI page)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class TorchServeError(BaseModel):
    """Every error of the TorchServe-compatible front."""

    code: int = Field(..., examples=[404])
    type: str = Field(..., examples=["ModelNotFoundException"])
    message: str = Field(..., examples=["no model named 'resnet-18'; GET /models lists them"])


class TorchServeStatus(BaseModel):
    """`GET /ping`: Healthy (200) once every model is ready, else Unhealthy (500)."""

    status: str = Field(..., examples=["Healthy"])
