"""Input × Gradient (Shrikumar et al. 2016, arXiv:1605.01713), through Captum's `InputXGradient`."""

from __future__ import annotations

from typing import Literal

from captum.attr import InputXGradient as CaptumInputXGradient
from torch import Tensor, nn

from service.introspection.attribution.base import (
    AttributionContext,
    AttributionMethod,
    Attributions,
    MethodParams,
    register_method,
)


class InputXGradientParams(MethodParams):
    method: Literal["input_x_gradient"] = "input_x_gradient"


@register_method
class InputXGradient(AttributionMethod[InputXGradientParams]):
    name = "input_x_gradient"
    params = InputXGradientParams
    title = "Input × Gradient (Shrikumar et al. 2016)"

    def attribute(
        self, model: nn.Module, x: Tensor, targets: list[int], params: InputXGradientParams, ctx: AttributionContext
    ) -> Attributions:
        return Attributions(CaptumInputXGradient(model).attribute(x, target=targets))
