"""Layer Integrated Gradients (Sundararajan et al. 2017, arXiv:1703.01365, at a layer's output), through Captum's
`LayerIntegratedGradients`: the path integral of the target score's gradient along the straight line from the
layer's output on a zero input to its output on the input, with convergence deltas.

The attribution has the layer's output shape (no batch dim); for a spatial layer its heatmap is the
max over channels of |attribution|, upsampled bilinearly to the input.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Literal

import torch
from captum.attr import LayerIntegratedGradients as CaptumLayerIntegratedGradients
from pydantic import Field
from torch import Tensor, nn

from service.config import Settings
from service.errors import InvalidField
from service.introspection.attribution.at_layer import layer_heatmap, layer_name, resolve_layer, single_run
from service.introspection.attribution.base import (
    AttributionContext,
    AttributionMethod,
    Attributions,
    MethodParams,
    register_method,
    same_dtype,
)


class LayerIntegratedGradientsParams(MethodParams):
    method: Literal["layer_integrated_gradients"] = "layer_integrated_gradients"
    layer: str | None = Field(None, description="layer_integrated_gradients: the layer (default the last Conv2d).")
    steps: int = Field(50, ge=1, description="layer_integrated_gradients: n_steps (limit max_ig_steps).")


@register_method
class LayerIntegratedGradients(AttributionMethod[LayerIntegratedGradientsParams]):
    """Requests with the same layer and steps share a batch; inputs go in chunks of `ig_internal_batch_size`,
    which also bounds each internal forward, as for integrated_gradients (and under its step limit)."""

    name = "layer_integrated_gradients"
    params = LayerIntegratedGradientsParams
    title = "Layer Integrated Gradients (Sundararajan et al. 2017) at a layer (default: the last Conv2d)"

    def chunk(self, params: LayerIntegratedGradientsParams, settings: Settings) -> int:
        return settings.ig_internal_batch_size

    def check_limits(self, params: LayerIntegratedGradientsParams, settings: Settings) -> None:
        if params.steps > settings.max_ig_steps:
            raise InvalidField(f"steps {params.steps} is over the limit of {settings.max_ig_steps} (max_ig_steps)")

    def resolve_layers(
        self, params: LayerIntegratedGradientsParams, names: Sequence[str]
    ) -> LayerIntegratedGradientsParams:
        return params.model_copy(update={"layer": resolve_layer(names, params.layer)})

    def batch_key(self, params: LayerIntegratedGradientsParams) -> Hashable:
        return params.layer, params.steps

    def attribute(
        self,
        model: nn.Module,
        x: Tensor,
        targets: list[int],
        params: Sequence[LayerIntegratedGradientsParams],
        ctx: AttributionContext,
    ) -> Attributions:
        own = params[0]  # layer and steps are equal within a batch (batch_key)
        name = layer_name(model, own.layer, self.name)
        layer = single_run(model, x, name, self.name)
        if layer.modified_in_place:
            raise InvalidField(
                f"layer_integrated_gradients: the output of {name!r} is modified in place later in the forward "
                "(an in-place ReLU or +=), and Captum replaces that output with the path's points, which cannot be; "
                "name another layer (the block around it, say)"
            )
        integrated = CaptumLayerIntegratedGradients(same_dtype(model, x.dtype), layer.module)
        batch = ctx.settings.ig_internal_batch_size
        rows, deltas = [], []
        for start in range(0, x.shape[0], batch):
            attr, delta = integrated.attribute(
                x[start : start + batch].detach(),
                baselines=0,
                target=targets[start : start + batch],
                n_steps=own.steps,
                internal_batch_size=batch,
                return_convergence_delta=True,
            )
            rows.append(attr)
            deltas.append(delta)
        return Attributions(torch.cat(rows), [float(d) for d in torch.cat(deltas).float().tolist()])

    def heatmap(self, row: Tensor, x: Tensor) -> Tensor:
        return layer_heatmap(row, x)
