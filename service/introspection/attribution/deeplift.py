"""DeepLIFT (Shrikumar et al. 2017, arXiv:1704.02685) with the Rescale rule, through Captum's `DeepLift`,
from a constant baseline, with convergence deltas.

Captum keeps one input and output per activation module (ReLU, MaxPool2d, Sigmoid, ...) between
its forward and its backward, so a module that runs several times per forward (LeNet's shared
`relu` and `pool`, the `relu` of every torchvision ResNet block) makes it fail in the backward.
Such models are refused up front with a 422 naming the modules; non-linearities applied
functionally (`F.relu`) are not rescaled, but keep their gradient, as Captum says.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Literal

import torch
from captum.attr import DeepLift as CaptumDeepLift
from captum.attr._core.deep_lift import SUPPORTED_NON_LINEAR  # the module types Captum's DeepLift hooks
from pydantic import Field
from torch import Tensor, nn

from service.errors import InvalidField
from service.introspection.attribution.at_layer import probe_runs
from service.introspection.attribution.base import (
    AttributionContext,
    AttributionMethod,
    Attributions,
    MethodParams,
    register_method,
)
from service.introspection.attribution.captum_notices import hook_notices_off

_CAPTUM_ATTRIBUTES = ("input", "output")  # what Captum's DeepLift sets on each hooked module


class DeepLiftParams(MethodParams):
    method: Literal["deeplift"] = "deeplift"
    baseline: float = Field(
        0.0,
        ge=-1e6,
        le=1e6,
        allow_inf_nan=False,
        description="deeplift: the reference input, this value everywhere (in the model's input space).",
    )


def activation_modules(model: nn.Module) -> dict[str, nn.Module]:
    """The modules Captum's DeepLift hooks: those of a type it has a rule for."""
    return {name: module for name, module in model.named_modules() if type(module) in SUPPORTED_NON_LINEAR}


def refuse_reused_activations(model: nn.Module, x: Tensor) -> None:
    """A 422 naming every activation module that runs more than once in a forward of the first row of `x`."""
    runs = probe_runs(model, x, activation_modules(model))
    reused = [f"{name!r} runs {run.calls} times" for name, run in runs.items() if run.calls > 1]
    if reused:
        raise InvalidField(
            "deeplift: Captum's DeepLift keeps one input and output per activation module, so each must run once "
            f"per forward, but in this model {', '.join(reused)}; use a model with one module per activation "
            "call, or another method"
        )


@contextmanager
def captum_attributes_removed(modules: Sequence[nn.Module]) -> Iterator[None]:
    """Remove, on exit, the tensors Captum's DeepLift left on `modules` (it deletes them in its backward, which a
    failure may never reach): the served model stays as it was loaded."""
    before = [{name for name in _CAPTUM_ATTRIBUTES if name in vars(module)} for module in modules]
    try:
        yield
    finally:
        for module, had in zip(modules, before, strict=True):
            for name in _CAPTUM_ATTRIBUTES:
                if name in vars(module) and name not in had:
                    delattr(module, name)


@register_method
class DeepLift(AttributionMethod[DeepLiftParams]):
    """One Captum call for the batch (each row with its own baseline value): a forward of the inputs and their
    baselines together and one backward, then the forwards of the convergence deltas."""

    name = "deeplift"
    params = DeepLiftParams
    title = "DeepLIFT (Shrikumar et al. 2017), Rescale rule, from a constant baseline, with convergence deltas"

    def attribute(
        self,
        model: nn.Module,
        x: Tensor,
        targets: list[int],
        params: Sequence[DeepLiftParams],
        ctx: AttributionContext,
    ) -> Attributions:
        refuse_reused_activations(model, x)
        baselines = torch.stack([torch.full_like(x[i], own.baseline) for i, own in enumerate(params)]).detach()
        with captum_attributes_removed(list(activation_modules(model).values())), hook_notices_off():
            rows, deltas = CaptumDeepLift(model).attribute(
                x, baselines=baselines, target=targets, return_convergence_delta=True
            )
        return Attributions(rows, [float(d) for d in deltas.float().tolist()])
