"""Neuron gradient, through Captum's `NeuronGradient`: the gradient of one unit of a layer's output with respect
to the input (the "what excites this unit" map of Simonyan et al. 2014, arXiv:1312.6034, for a hidden unit).

The map does not depend on `target`; the answer's target, score and probability are the model's,
as for every method.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Annotated, Literal

from captum.attr import NeuronGradient as CaptumNeuronGradient
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
    same_dtype,
)


class NeuronGradientParams(MethodParams):
    method: Literal["neuron_gradient"] = "neuron_gradient"
    layer: str | None = Field(None, description="neuron_gradient: the layer (default the last Conv2d).")
    neuron: list[Annotated[int, Field(ge=0)]] = Field(
        ...,
        min_length=1,
        max_length=8,
        examples=[[3, 4, 4]],
        description="neuron_gradient: the unit's index in the layer's output, without the batch dim "
        "([channel, y, x] for a conv layer, [unit] for a linear one).",
    )


@register_method
class NeuronGradient(AttributionMethod[NeuronGradientParams]):
    """Requests with the same layer and neuron share a batch: one forward and one backward from that unit."""

    name = "neuron_gradient"
    params = NeuronGradientParams
    title = "Neuron gradient: the input gradient of one unit of a layer (default: the last Conv2d)"

    def resolve_layers(self, params: NeuronGradientParams, names: Sequence[str]) -> NeuronGradientParams:
        return params.model_copy(update={"layer": resolve_layer(names, params.layer)})

    def batch_key(self, params: NeuronGradientParams) -> Hashable:
        return params.layer, tuple(params.neuron)

    def attribute(
        self,
        model: nn.Module,
        x: Tensor,
        targets: list[int],
        params: Sequence[NeuronGradientParams],
        ctx: AttributionContext,
    ) -> Attributions:
        own = params[0]  # layer and neuron are equal within a batch (batch_key)
        name = layer_name(model, own.layer, self.name)
        layer = single_run(model, x, name, self.name)
        neuron, shape = list(own.neuron), list(layer.shape)
        if len(neuron) != len(shape) or any(i >= size for i, size in zip(neuron, shape, strict=True)):
            raise InvalidField(
                f"neuron_gradient: neuron {neuron} is not a unit of {name!r}, whose output is {shape} per "
                f"input; give {len(shape)} indices, each below its dim"
            )
        gradient = CaptumNeuronGradient(same_dtype(model, x.dtype), layer.module)
        return Attributions(gradient.attribute(x, neuron_selector=tuple(neuron)))
