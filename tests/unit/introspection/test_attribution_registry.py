"""Attribution methods register themselves once, each with its own parameters and request."""

from __future__ import annotations

import typing
from collections.abc import Sequence

import pytest
from torch import Tensor, nn

from service.introspection.attribution import registered_methods
from service.introspection.attribution.base import (
    AttributionContext,
    AttributionMethod,
    Attributions,
    MethodParams,
    register_method,
)
from service.introspection.attribution.requests import choose_request, request_class
from service.schemas.attribution import SaliencyCommon


def test_the_methods_in_their_listed_order() -> None:
    assert list(registered_methods()) == [
        "gradient",
        "input_x_gradient",
        "smoothgrad",
        "integrated_gradients",
        "gradcam",
        "occlusion",
        "feature_ablation",
        "guided_backprop",
        "deconvolution",
        "guided_gradcam",
        "deeplift",
        "gradient_shap",
        "layer_conductance",
        "layer_integrated_gradients",
        "neuron_gradient",
        "attention_rollout",
        "gradient_weighted_attention",
    ]


@pytest.mark.parametrize("name", list(registered_methods()))
def test_each_method_names_itself_in_its_parameters(name: str) -> None:
    method = registered_methods()[name]
    assert typing.get_args(method.params.model_fields["method"].annotation) == (name,)
    request = request_class(name)
    assert issubclass(request, SaliencyCommon)
    assert issubclass(request, method.params)
    assert choose_request({"method": name}) is request


def test_no_method_means_gradient() -> None:
    assert choose_request({}) is request_class("gradient")


def test_a_name_registered_twice_is_refused() -> None:
    class Again(AttributionMethod[MethodParams]):
        name = "gradient"
        params = MethodParams
        title = "again"

        def attribute(
            self,
            model: nn.Module,
            x: Tensor,
            targets: list[int],
            params: Sequence[MethodParams],
            ctx: AttributionContext,
        ) -> Attributions:
            return Attributions(x)

    with pytest.raises(ValueError, match="registered twice"):
        register_method(Again)
