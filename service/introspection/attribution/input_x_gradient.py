"""Input × Gradient (Shrikumar et al. 2016, arXiv:1605.01713), as Captum's `InputXGradient` computes it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from torch import Tensor, nn

from service.introspection.attribution.base import INPUT, AttributionMethod, MethodParams, register_method


class InputXGradientParams(MethodParams):
    method: Literal["input_x_gradient"] = "input_x_gradient"


@register_method
class InputXGradient(AttributionMethod[InputXGradientParams]):
    """One forward and one backward to the input: the input times the gradient of each row's target score."""

    name = "input_x_gradient"
    params = InputXGradientParams
    title = "Input × Gradient (Shrikumar et al. 2016)"

    def graph_from(self, params: InputXGradientParams, model: nn.Module) -> str:
        return INPUT

    def from_graph(
        self, kept: Sequence[Tensor], grads: Sequence[Tensor], params: InputXGradientParams, x: Tensor
    ) -> Tensor:
        return kept[0] * grads[0]
