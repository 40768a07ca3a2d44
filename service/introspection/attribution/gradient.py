"""Saliency: |d score / d input| (Simonyan et al. 2014, arXiv:1312.6034), through Captum's `Saliency`."""

from __future__ import annotations

from typing import Literal

from captum.attr import Saliency
from torch import Tensor, nn

from service.introspection.attribution.base import (
    AttributionContext,
    AttributionMethod,
    Attributions,
    MethodParams,
    register_method,
)


class GradientParams(MethodParams):
    method: Literal["gradient"] = "gradient"


@register_method
class Gradient(AttributionMethod[GradientParams]):
    name = "gradient"
    params = GradientParams
    title = "Saliency (Simonyan et al. 2014): the absolute input gradient"

    def attribute(
        self, model: nn.Module, x: Tensor, targets: list[int], params: GradientParams, ctx: AttributionContext
    ) -> Attributions:
        return Attributions(Saliency(model).attribute(x, target=targets, abs=True))
