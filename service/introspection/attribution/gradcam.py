"""Grad-CAM (Selvaraju et al. 2017, arXiv:1610.02391) at a spatial layer, by the formula Captum's `LayerGradCam` uses.

One forward, without autograd until the layer, and one backward from the target scores to
that layer's output only: the channel weights are the spatially averaged gradients, the map
is the ReLU of the weighted channel sum.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Literal

import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

from service.errors import InvalidField
from service.introspection.attribution.base import AttributionMethod, MethodParams, register_method
from service.introspection.layers import last_conv2d, resolve_layers


def gradcam_map(act: Tensor, grad: Tensor) -> Tensor:
    """`[N, 1, h, w]`: ReLU of the channels of `act` `[N, C, h, w]` weighted by their spatially averaged gradients."""
    weights = grad.mean(dim=(2, 3), keepdim=True)
    return F.relu((weights * act).sum(dim=1, keepdim=True))


class GradCamParams(MethodParams):
    method: Literal["gradcam"] = "gradcam"
    layer: str | None = Field(None, description="gradcam: the layer (default the last Conv2d).")


@register_method
class GradCam(AttributionMethod[GradCamParams]):
    """The map is `[h, w]` at the layer's resolution; its heatmap is that map resized bilinearly to the input."""

    name = "gradcam"
    params = GradCamParams
    title = "Grad-CAM (Selvaraju et al. 2017) at a layer (default: the last Conv2d)"

    def resolve_layers(self, params: GradCamParams, names: Sequence[str]) -> GradCamParams:
        if params.layer is None:
            return params
        return params.model_copy(update={"layer": resolve_layers(names, [params.layer], 1)[0]})

    def batch_key(self, params: GradCamParams) -> Hashable:
        return params.layer

    def graph_from(self, params: GradCamParams, model: nn.Module) -> str:
        if params.layer is not None:
            return params.layer
        name = last_conv2d(model)
        if name is None:
            raise InvalidField("gradcam needs a layer: this model has no Conv2d, so name one in `layer`")
        return name

    def from_graph(self, kept: Sequence[Tensor], grads: Sequence[Tensor], params: GradCamParams, x: Tensor) -> Tensor:
        where = repr(params.layer) if params.layer is not None else "the default layer"
        if len(kept) != 1:
            raise InvalidField(
                f"gradcam needs a layer with one spatial output [N, C, h, w] on an image input; {where} gives "
                "several outputs"
            )
        act, grad = kept[0], grads[0]
        if act.dim() != 4 or x.dim() < 3:
            shape = [act.shape[0], 1, *act.shape[2:]]
            raise InvalidField(
                f"gradcam needs a layer with one spatial output [N, C, h, w] on an image input; {where} gives "
                f"maps of shape {shape}"
            )
        return gradcam_map(act, grad)

    def attribution_row(self, row: Tensor) -> Tensor:
        return row[0]

    def heatmap(self, row: Tensor, x: Tensor) -> Tensor:
        return F.interpolate(row[None].float(), size=tuple(x.shape[-2:]), mode="bilinear", align_corners=False)[0, 0]
