"""GET /models/{name}/nodes: a model's functional (FX graph) nodes."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Node(BaseModel):
    name: str = Field(
        ...,
        description="torchvision's node name (get_graph_node_names): module path, then the op, `_1` for repeats.",
        examples=["layer1.0.add"],
    )
    op: str = Field(
        ...,
        description="placeholder | get_attr | call_function | call_method | call_module",
        examples=["call_function"],
    )
    target: str = Field(
        ..., description="The module path, method or attribute name, or function called.", examples=["operator.add"]
    )
    module: str = Field(
        ..., description='The module whose forward runs the node (the called module for call_module; root "").'
    )
    module_type: str = Field(..., examples=["BasicBlock"])
    inputs: list[str] = Field(
        ..., description="The nodes whose outputs it takes.", examples=[["layer1.0.bn2", "maxpool"]]
    )
    shape: list[Any] | None = Field(
        ...,
        description="Output shape at the model's input size, batch 1; a list of shapes for a tuple; null: no tensor.",
        examples=[[1, 64, 56, 56]],
    )
    dtype: str | None = Field(..., examples=["float32"])


class NodeList(BaseModel):
    model_config = ConfigDict(protected_namespaces=())

    model: str
    input_size: list[int] = Field(..., description="The batch the shapes are for.", examples=[[1, 3, 224, 224]])
    nodes: list[Node] = Field(..., description="In graph (execution) order.")
