"""Saliency: |d score / d input| (Simonyan et al. 2014, arXiv:1312.6034), as Captum's `Saliency` computes it
(`abs=True`, its default); `abs: false` gives the signed gradient, Captum's `Saliency(...).attribute(abs=False)`."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Literal

from pydantic import Field
from torch import Tensor, nn

from service.introspection.attribution.base import INPUT, AttributionMethod, MethodParams, register_method


class GradientParams(MethodParams):
    method: Literal["gradient"] = "gradient"
    abs: bool = Field(
        True, description="gradient: the absolute gradient (Captum's Saliency, abs=True); false: the signed gradient."
    )


@register_method
class Gradient(AttributionMethod[GradientParams]):
    """One forward and one backward to the input: the (absolute) gradient of each row's target score."""

    name = "gradient"
    params = GradientParams
    title = "Saliency (Simonyan et al. 2014): the absolute input gradient"

    def batch_key(self, params: GradientParams) -> Hashable:
        return params.abs

    def graph_from(self, params: GradientParams, model: nn.Module) -> str:
        return INPUT

    def from_graph(self, kept: Sequence[Tensor], grads: Sequence[Tensor], params: GradientParams, x: Tensor) -> Tensor:
        return grads[0].abs() if params.abs else grads[0]
