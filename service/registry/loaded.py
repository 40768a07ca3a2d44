"""A model that is built, weighted, placed on its device and warmed up."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from service.introspection.attention import AttentionModules
from service.introspection.nodes import NodeGraph, Untraceable
from service.introspection.shape_propagation import ShapePropagation
from service.introspection.shapes import LayerShapes
from service.registry.capture_plans import CapturePlans, PlanSettings
from service.registry.packed_convolutions import ConvPacks
from service.registry.row_times import RowTimes
from service.specs.model import ModelSpec, PreprocessSpec


@dataclass
class LoadedModel:
    """Everything the runtime and introspection need to serve one model."""

    spec: ModelSpec
    module: nn.Module
    device: torch.device
    dtype: torch.dtype
    preprocess: PreprocessSpec
    input_size: list[int]
    labels: list[str] | None
    optimizer: torch.optim.Optimizer | None
    weights: str
    num_classes: int | None
    num_parameters: int
    trainable_parameters: int
    text: str = field(repr=False)
    layer_names: tuple[str, ...] = field(default=(), repr=False)  # module paths, named_modules() order
    layer_shapes: LayerShapes = field(default_factory=LayerShapes, repr=False)  # at input_size: costs of requests
    shape_propagation: ShapePropagation | None = field(default=None, repr=False)  # layer shapes at other sizes
    row_times: RowTimes = field(default_factory=RowTimes)  # seconds per row at input_size: request time estimates
    channels_last: bool = False  # 4-D weights and inputs in NHWC (see loader.use_channels_last)
    fast: nn.Module | None = field(default=None, repr=False)  # the prediction path's own copy (fused, compiled)
    prediction_path: str = "eager"  # what `fast` is (fast_path.PredictionPath.name); "eager" when None
    prediction_path_reason: str = ""  # why not a faster path, when not
    conv_packs: ConvPacks | None = field(default=None, repr=False)  # packed Conv2d weights (packed_convolutions.py)
    conv_packs_reason: str = ""  # why there are none, when there are none
    predictions_packed: bool = False  # whether the prediction module's convolutions use `conv_packs` too
    summary_cache: dict[tuple[object, ...], object] = field(default_factory=dict, repr=False)
    node_graph: NodeGraph | Untraceable | None = field(default=None, repr=False)  # FX nodes, traced on first use
    lanes: tuple[nn.Module, ...] = field(default=(), repr=False)  # copies hooked batches run on (lanes.py)
    attention: AttentionModules = field(default_factory=AttentionModules, repr=False)  # readable attention modules
    capture_plans: CapturePlans = field(  # forward-only captures on ONNX Runtime (capture_plans.py),
        default_factory=lambda: CapturePlans(None, PlanSettings(), "not served by an executor"), repr=False
    )  # set by the model's executor

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def prediction_module(self) -> nn.Module:
        """What plain predictions call: the fast copy when there is one, else the eager module.

        Hooks are only ever registered on `module`; the fast copy shares no submodule with it,
        so no hook fires for a prediction and no compiled graph ever sees a hook.
        """
        return self.fast if self.fast is not None else self.module

    @property
    def hookable_modules(self) -> tuple[nn.Module, ...]:
        """Every module object a hook may be registered on: the served module and its hook lanes."""
        return (self.module, *self.lanes)

    @property
    def channels(self) -> int:
        return self.input_size[0]

    def label(self, index: int) -> str:
        if self.labels is not None and 0 <= index < len(self.labels):
            return self.labels[index]
        return str(index)
