"""Layer Integrated Gradients (Sundararajan et al. 2017, arXiv:1703.01365, at a layer's output), through Captum's
`LayerIntegratedGradients`: the path integral of the target score's gradient along the straight line from the
layer's output on a zero input to its output on the input, with convergence deltas.

The attribution has the layer's output shape (no batch dim); for a spatial layer its heatmap is the
max over channels of |attribution|, upsampled bilinearly to the input.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from captum.attr import LayerIntegratedGradients as CaptumLayerIntegratedGradients
from pydantic import Field
from torch import Tensor, nn

from service.errors import InvalidField
from service.introspection.attribution.at_layer import LayerPathMethod, LayerPathParams, layer_name, single_run
from service.introspection.attribution.base import AttributionContext, Attributions, register_method, same_dtype


class LayerIntegratedGradientsParams(LayerPathParams):
    method: Literal["layer_integrated_gradients"] = "layer_integrated_gradients"
    layer: str | None = Field(None, description="layer_integrated_gradients: the layer (default the last Conv2d).")
    steps: int = Field(50, ge=1, description="layer_integrated_gradients: n_steps (limit max_ig_steps).")


@register_method
class LayerIntegratedGradients(LayerPathMethod[LayerIntegratedGradientsParams]):
    """Each forward also sees at most `ig_internal_batch_size` examples, as for integrated_gradients (and under
    its step limit)."""

    name = "layer_integrated_gradients"
    params = LayerIntegratedGradientsParams
    title = "Layer Integrated Gradients (Sundararajan et al. 2017) at a layer (default: the last Conv2d)"
    steps_limit = "max_ig_steps"

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
        batch = ctx.rows_per_forward(ctx.settings.ig_internal_batch_size)
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
