"""Layer conductance (Dhamdhere et al. 2018, arXiv:1805.12233), through Captum's `LayerConductance`: how much
of the target score's change from a zero baseline flows through each unit of a layer, with convergence deltas.

The attribution has the layer's output shape (no batch dim); for a spatial layer its heatmap is the
max over channels of |attribution|, upsampled bilinearly to the input.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from captum.attr import LayerConductance as CaptumLayerConductance
from pydantic import Field
from torch import Tensor, nn

from service.introspection.attribution.at_layer import LayerPathMethod, LayerPathParams, layer_name, single_run
from service.introspection.attribution.base import AttributionContext, Attributions, register_method, same_dtype


class LayerConductanceParams(LayerPathParams):
    method: Literal["layer_conductance"] = "layer_conductance"
    layer: str | None = Field(None, description="layer_conductance: the layer (default the last Conv2d).")
    steps: int = Field(50, ge=1, description="layer_conductance: n_steps (limit max_conductance_steps).")


@register_method
class LayerConductance(LayerPathMethod[LayerConductanceParams]):
    """Conductance differences consecutive path points, so inputs go in chunks of half the rows per forward (at
    least one) and no forward sees more examples than those rows (or two, when that is 1)."""

    name = "layer_conductance"
    params = LayerConductanceParams
    title = "Layer conductance (Dhamdhere et al. 2018) at a layer (default: the last Conv2d), with convergence deltas"
    steps_limit = "max_conductance_steps"
    least_rows = 2  # consecutive path points of one input

    def attribute(
        self,
        model: nn.Module,
        x: Tensor,
        targets: list[int],
        params: Sequence[LayerConductanceParams],
        ctx: AttributionContext,
    ) -> Attributions:
        own = params[0]  # layer and steps are equal within a batch (batch_key)
        layer = single_run(model, x, layer_name(model, own.layer, self.name), self.name)
        conductance = CaptumLayerConductance(same_dtype(model, x.dtype), layer.module)
        bound = ctx.rows_per_forward(ctx.settings.ig_internal_batch_size)
        chunk = max(1, bound // 2)
        rows, deltas = [], []
        for start in range(0, x.shape[0], chunk):
            inputs = x[start : start + chunk].detach()
            attr, delta = conductance.attribute(
                inputs,
                baselines=0,
                target=targets[start : start + chunk],
                n_steps=own.steps,
                internal_batch_size=max(bound, 2 * inputs.shape[0]),
                return_convergence_delta=True,
            )
            rows.append(attr)
            deltas.append(delta)
        return Attributions(torch.cat(rows), [float(d) for d in torch.cat(deltas).float().tolist()])
