"""Grad-CAM (Selvaraju et al. 2017, arXiv:1610.02391) at a spatial layer, through Captum's `LayerGradCam`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch.nn.functional as F
from captum.attr import LayerGradCam
from pydantic import Field
from torch import Tensor, nn

from service.errors import InvalidField
from service.introspection.attribution.base import (
    AttributionContext,
    AttributionMethod,
    Attributions,
    MethodParams,
    register_method,
)
from service.introspection.gradients import find_layer
from service.introspection.layers import last_conv2d, resolve_layers


class GradCamParams(MethodParams):
    method: Literal["gradcam"] = "gradcam"
    layer: str | None = Field(None, description="gradcam: the layer (default the last Conv2d).")


@register_method
class GradCam(AttributionMethod[GradCamParams]):
    """The map is `[h, w]` at the layer's resolution (ReLU of the gradient-weighted channel sum);
    its heatmap is that map resized bilinearly to the input."""

    name = "gradcam"
    params = GradCamParams
    title = "Grad-CAM (Selvaraju et al. 2017) at a layer (default: the last Conv2d)"

    def resolve_layers(self, params: GradCamParams, names: Sequence[str]) -> GradCamParams:
        if params.layer is None:
            return params
        return params.model_copy(update={"layer": resolve_layers(names, [params.layer], 1)[0]})

    def attribute(
        self, model: nn.Module, x: Tensor, targets: list[int], params: GradCamParams, ctx: AttributionContext
    ) -> Attributions:
        name = params.layer if params.layer is not None else last_conv2d(model)
        if name is None:
            raise InvalidField("gradcam needs a layer: this model has no Conv2d, so name one in `layer`")
        maps = LayerGradCam(model, find_layer(model, name)).attribute(x, target=targets, relu_attributions=True)
        return Attributions(_checked_maps(maps, params.layer, x))

    def attribution_row(self, row: Tensor) -> Tensor:
        return row[0]

    def heatmap(self, row: Tensor, x: Tensor) -> Tensor:
        return F.interpolate(row[None].float(), size=tuple(x.shape[-2:]), mode="bilinear", align_corners=False)[0, 0]


def _checked_maps(maps: object, layer: str | None, x: Tensor) -> Tensor:
    """Grad-CAM must give `[N, 1, h, w]` maps (a spatial layer with one output), else InvalidField."""
    if isinstance(maps, Tensor) and maps.dim() == 4 and maps.shape[1] == 1 and x.dim() >= 3:
        return maps.detach()
    where = repr(layer) if layer is not None else "the default layer"
    got = f"maps of shape {list(maps.shape)}" if isinstance(maps, Tensor) else "several outputs"
    raise InvalidField(
        f"gradcam needs a layer with one spatial output [N, C, h, w] on an image input; {where} gives {got}"
    )
