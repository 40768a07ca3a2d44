"""Responses of the read-only introspection endpoints: layers, summary, state dict, optimizer, checkpoints."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class Layer(BaseModel):
    name: str = Field(..., description='Module path; the root is "".', examples=["features.4"])
    type: str = Field(..., examples=["MaxPool2d"])
    depth: int = Field(..., examples=[2])
    num_parameters: int = Field(..., description="Parameters of the whole subtree.", examples=[0])
    children: list[str] = Field(..., description="Full names of the direct children.")


class LayerList(BaseModel):
    layers: list[Layer]


class SummaryRow(BaseModel):
    name: str = Field(..., examples=["conv1"])
    type: str = Field(..., examples=["Conv2d"])
    depth: int
    depth_index: int | None
    output_shape: list[Any] = Field(..., examples=[[1, 6, 28, 28]])
    num_parameters: int
    mult_adds: int


class Summary(BaseModel):
    rows: list[SummaryRow]
    total_params: int
    trainable_params: int
    non_trainable_params: int
    total_mult_adds: int
    input_size_mb: float
    forward_backward_pass_size_mb: float
    params_size_mb: float
    estimated_total_size_mb: float
    text: str = Field(..., description="torchinfo's table.")


class StateDictEntry(BaseModel):
    key: str = Field(..., examples=["conv1.weight"])
    shape: list[int] = Field(..., examples=[[6, 3, 5, 5]])
    dtype: str = Field(..., examples=["float32"])
    numel: int
    bytes: int
    kind: str = Field(..., description="parameter | buffer")
    requires_grad: bool | None
    min: float | None = None
    max: float | None = None
    mean: float | None = None
    std: float | None = None
    norm: float | None = None
    nan_count: int | None = None
    inf_count: int | None = None


class StateDict(BaseModel):
    entries: list[StateDictEntry]
    num_tensors: int
    total_numel: int
    total_bytes: int


class OptimizerParamGroup(BaseModel, extra="allow"):
    params: list[int]
    param_names: list[str | None] | None


class OptimizerState(BaseModel):
    param: int
    param_name: str | None
    entries: dict[str, Any] = Field(..., examples=[{"momentum_buffer": {"shape": [6, 3, 5, 5], "dtype": "float32"}}])


class OptimizerInfo(BaseModel):
    type: str | None = Field(..., examples=["SGD"])
    param_groups: list[OptimizerParamGroup]
    state: list[OptimizerState]


class CheckpointStateDict(BaseModel):
    entries: list[StateDictEntry]
    total_numel: int


class CheckpointCompare(BaseModel):
    missing_keys: list[str]
    unexpected_keys: list[str]
    shape_mismatches: list[dict[str, Any]]


class CheckpointInspection(BaseModel):
    format: str = Field(..., description="pickle | safetensors")
    state_dicts: dict[str, CheckpointStateDict]
    optimizers: dict[str, OptimizerInfo]
    other: dict[str, Any] = Field(..., examples=[{"epoch": 7, "loss": 0.03}])
    compare: CheckpointCompare | None = None


class CheckpointPath(BaseModel):
    path: str = Field(..., description="A file under the model dir.", examples=["resnet18.pth"])
