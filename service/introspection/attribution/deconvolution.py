"""Deconvolution (Zeiler & Fergus 2014, arXiv:1311.2901), through Captum's `Deconvolution`.

The input gradient of the target score, with every `nn.ReLU` passing back the ReLU of the gradient
it receives, whatever its input was (Springenberg et al. 2015 set it beside guided backprop).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from captum.attr import Deconvolution as CaptumDeconvolution
from torch import Tensor, nn

from service.introspection.attribution.base import (
    AttributionContext,
    AttributionMethod,
    Attributions,
    MethodParams,
    register_method,
)
from service.introspection.attribution.captum_notices import hook_notices_off


class DeconvolutionParams(MethodParams):
    method: Literal["deconvolution"] = "deconvolution"


@register_method
class Deconvolution(AttributionMethod[DeconvolutionParams]):
    """One forward and backward of the batch; Captum sets the ReLU hooks and removes them in `finally`."""

    name = "deconvolution"
    params = DeconvolutionParams
    title = "Deconvolution (Zeiler & Fergus 2014): the gradient with ReLUs passing back ReLU(gradient)"

    def attribute(
        self,
        model: nn.Module,
        x: Tensor,
        targets: list[int],
        params: Sequence[DeconvolutionParams],
        ctx: AttributionContext,
    ) -> Attributions:
        with hook_notices_off():
            return Attributions(CaptumDeconvolution(model).attribute(x, target=targets))
