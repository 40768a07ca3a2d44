"""Saliency: |d score / d input| (Simonyan et al. 2014, arXiv:1312.6034), as Captum's `Saliency` computes it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from torch import Tensor, nn

from service.introspection.attribution.base import INPUT, AttributionMethod, MethodParams, register_method


class GradientParams(MethodParams):
    method: Literal["gradient"] = "gradient"


@register_method
class Gradient(AttributionMethod[GradientParams]):
    """One forward and one backward to the input: the absolute gradient of each row's target score."""

    name = "gradient"
    params = GradientParams
    title = "Saliency (Simonyan et al. 2014): the absolute input gradient"

    def graph_from(self, params: GradientParams, model: nn.Module) -> str:
        return INPUT

    def from_graph(self, kept: Sequence[Tensor], grads: Sequence[Tensor], params: GradientParams, x: Tensor) -> Tensor:
        return grads[0].abs()
