"""Guided backpropagation (Springenberg et al. 2015, arXiv:1412.6806), through Captum's `GuidedBackprop`.

The input gradient of the target score, with every `nn.ReLU` passing back only positive gradients
(and only where its input was positive). ReLUs applied functionally (`F.relu`) keep their usual
gradient, as Captum says.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from captum.attr import GuidedBackprop as CaptumGuidedBackprop
from torch import Tensor, nn

from service.introspection.attribution.base import (
    AttributionContext,
    AttributionMethod,
    Attributions,
    MethodParams,
    register_method,
)
from service.introspection.attribution.captum_notices import hook_notices_off


class GuidedBackpropParams(MethodParams):
    method: Literal["guided_backprop"] = "guided_backprop"


@register_method
class GuidedBackprop(AttributionMethod[GuidedBackpropParams]):
    """One forward and backward of the batch; Captum sets the ReLU hooks and removes them in `finally`."""

    name = "guided_backprop"
    params = GuidedBackpropParams
    title = "Guided backpropagation (Springenberg et al. 2015): positive gradients through every ReLU"

    def attribute(
        self,
        model: nn.Module,
        x: Tensor,
        targets: list[int],
        params: Sequence[GuidedBackpropParams],
        ctx: AttributionContext,
    ) -> Attributions:
        with hook_notices_off():
            return Attributions(CaptumGuidedBackprop(model).attribute(x, target=targets))
