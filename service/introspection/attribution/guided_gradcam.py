"""Guided Grad-CAM (Selvaraju et al. 2017, arXiv:1610.02391), through Captum's `GuidedGradCam`: guided
backpropagation times the layer's Grad-CAM map upsampled to the input."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from enum import StrEnum
from typing import Literal

import torch
import torch.nn.functional as F
from captum.attr import GuidedBackprop as CaptumGuidedBackprop
from captum.attr import GuidedGradCam as CaptumGuidedGradCam
from pydantic import Field
from torch import Tensor, nn

from service.errors import InvalidField
from service.introspection.attribution.at_layer import layer_name, resolve_layer, single_run
from service.introspection.attribution.base import (
    AttributionContext,
    AttributionMethod,
    Attributions,
    MethodParams,
    register_method,
)
from service.introspection.attribution.captum_notices import hook_notices_off
from service.introspection.attribution.gradcam import gradcam_map
from service.introspection.gradients import layer_gradients
from service.introspection.tokens import TokenLayout, patch_grid, token_layout


class GradCamUpsampling(StrEnum):
    nearest = "nearest"
    bilinear = "bilinear"
    bicubic = "bicubic"
    area = "area"


class GuidedGradCamParams(MethodParams):
    method: Literal["guided_gradcam"] = "guided_gradcam"
    layer: str | None = Field(None, description="guided_gradcam: the Grad-CAM layer (default the last Conv2d).")
    upsampling: GradCamUpsampling = Field(
        GradCamUpsampling.nearest, description="guided_gradcam: how the layer's map is resized to the input (Captum's)."
    )


@register_method
class GuidedGradCam(AttributionMethod[GuidedGradCamParams]):
    """Requests with the same layer and upsampling share a batch (one Captum call: a forward and backward for
    Grad-CAM, another for guided backprop). The layer must run once and give a spatial map `[N, C, h, w]`, or a
    vision transformer's tokens `[N, T, D]`, whose patch tokens are read as a map."""

    name = "guided_gradcam"
    params = GuidedGradCamParams
    title = "Guided Grad-CAM (Selvaraju et al. 2017): guided backprop times the upsampled Grad-CAM map"

    def resolve_layers(self, params: GuidedGradCamParams, names: Sequence[str]) -> GuidedGradCamParams:
        return params.model_copy(update={"layer": resolve_layer(names, params.layer)})

    def batch_key(self, params: GuidedGradCamParams) -> Hashable:
        return params.layer, params.upsampling

    def attribute(
        self,
        model: nn.Module,
        x: Tensor,
        targets: list[int],
        params: Sequence[GuidedGradCamParams],
        ctx: AttributionContext,
    ) -> Attributions:
        own = params[0]  # layer and upsampling are equal within a batch (batch_key)
        name = layer_name(model, own.layer, self.name)
        layer = single_run(model, x, name, self.name)
        layout = token_layout(model, tuple(x.shape[1:]))
        if x.dim() == 4 and layout is not None and len(layer.shape) == 2 and layout.holds(layer.shape[0]):
            return Attributions(_over_tokens(model, x, targets, name, layout, own.upsampling.value), tokens=layout)
        if len(layer.shape) != 3 or x.dim() != 4:
            raise InvalidField(
                f"guided_gradcam needs a layer with a spatial output [N, C, h, w] on an image input; {name!r} "
                f"gives [N, {', '.join(map(str, layer.shape))}]"
            )
        with hook_notices_off():
            rows = CaptumGuidedGradCam(model, layer.module).attribute(
                x, target=targets, interpolate_mode=own.upsampling.value
            )
        return Attributions(rows)


def _over_tokens(  # noqa: PLR0917
    model: nn.Module, x: Tensor, targets: list[int], name: str, layout: TokenLayout, mode: str
) -> Tensor:
    """Guided Grad-CAM at a token layer: Grad-CAM on its patch tokens laid out on the grid (prefix tokens left out),
    upsampled to the input and multiplied by guided backpropagation, as Captum's `GuidedGradCam` does for maps."""
    found = layer_gradients(model, x, [name], lambda logits: targets, include_input=False)
    key = found.keys[name][0]
    cam = gradcam_map(patch_grid(found.kept[key], layout), patch_grid(found.gradients[key], layout))
    with hook_notices_off(), torch.enable_grad():
        guided: Tensor = CaptumGuidedBackprop(model).attribute(x, target=targets)
    return guided * F.interpolate(cam, size=tuple(x.shape[2:]), mode=mode)
