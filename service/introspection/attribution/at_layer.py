"""What the methods that attribute at, or through, one layer share.

Captum's layer and neuron methods (and Guided Grad-CAM's Grad-CAM half) hook a *module*, not one
of its calls: a module that runs several times per forward (LeNet's shared `relu`) would mix its
calls, so the named layer is checked first, on one input row, to run once and return one tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from service.config import Settings
from service.errors import InvalidField
from service.introspection.attribution.base import AttributionMethod, MethodParams, halved, input_space_map
from service.introspection.hooks import HookScope
from service.introspection.layers import last_conv2d, resolve_layers


def resolve_layer(names: Sequence[str], layer: str | None) -> str | None:
    """The module path `layer` names (a pattern must match exactly one); None stays None (the default layer)."""
    return None if layer is None else resolve_layers(names, [layer], 1)[0]


def layer_name(model: nn.Module, layer: str | None, method: str) -> str:
    """`layer`, else the model's last Conv2d (a 422 when it has none)."""
    if layer is not None:
        return layer
    found = last_conv2d(model)
    if found is None:
        raise InvalidField(f"{method} needs a layer: this model has no Conv2d, so name one in `layer`")
    return found


@dataclass(frozen=True)
class LayerRun:
    """How a module ran in one forward: its calls; the shape (no batch dim) of its first call's output, None when
    that is not one floating-point tensor; and whether later code modified that output in place (`+=`, an
    in-place ReLU)."""

    calls: int
    shape: tuple[int, ...] | None
    modified_in_place: bool = False


def probe_runs(model: nn.Module, x: Tensor, modules: dict[str, nn.Module]) -> dict[str, LayerRun]:
    """Run the first row of `x` once, without autograd, watching each module's calls (hooks removed on exit)."""
    calls = dict.fromkeys(modules, 0)
    outputs: dict[str, tuple[Tensor, int]] = {}  # the first call's output and its version counter then

    def recorder(name: str) -> Callable[[nn.Module, Any, Any], None]:
        def record(module: nn.Module, args: Any, output: Any) -> None:
            calls[name] += 1
            if calls[name] == 1 and isinstance(output, Tensor) and output.is_floating_point():
                outputs[name] = (output, output._version)

        return record

    with torch.no_grad(), HookScope(model) as scope:
        for name, module in modules.items():
            scope.add(module.register_forward_hook(recorder(name)))
        model(x[:1].detach())
    runs = {}
    for name in modules:
        found = outputs.get(name)
        if found is None:
            runs[name] = LayerRun(calls[name], None)
        else:
            output, version = found
            runs[name] = LayerRun(calls[name], tuple(output.shape[1:]), output._version != version)
    return runs


@dataclass(frozen=True)
class Layer:
    """A layer that runs once per forward with one floating-point tensor out: its module, that tensor's shape
    (no batch dim), and whether later code modifies it in place."""

    module: nn.Module
    shape: tuple[int, ...]
    modified_in_place: bool


def single_run(model: nn.Module, x: Tensor, name: str, method: str) -> Layer:
    """The layer `name`, after a 422 unless it runs once in a forward of `x[:1]` and returns one tensor."""
    module = model.get_submodule(name)
    run = probe_runs(model, x, {name: module})[name]
    if run.calls == 0:
        raise InvalidField(f"{method}: layer {name!r} does not run in the model's forward; name one that does")
    if run.calls > 1:
        raise InvalidField(
            f"{method}: layer {name!r} runs {run.calls} times per forward (one module called several times); "
            "Captum hooks the module, not one of its calls, so name a layer that runs once"
        )
    if run.shape is None:
        raise InvalidField(
            f"{method}: layer {name!r} does not return one floating-point tensor; name a layer that does"
        )
    return Layer(module, run.shape, run.modified_in_place)


def layer_heatmap(row: Tensor, x: Tensor) -> Tensor:
    """A layer attribution `[C, h, w]` as the max over channels of |a|, upsampled bilinearly to the input's
    H×W (as Grad-CAM's map is); a layer without spatial dims keeps its own units (`[1, L]` for `[L]`)."""
    magnitude = input_space_map(row)
    if row.dim() == 3 and x.dim() == 4:
        size = tuple(x.shape[-2:])
        return F.interpolate(magnitude[None, None], size=size, mode="bilinear", align_corners=False)[0, 0]
    return magnitude


class LayerPathParams(MethodParams):
    """A path integral at one layer: the layer (None, the last Conv2d) and the path's steps."""

    layer: str | None = None
    steps: int = 50


LP = TypeVar("LP", bound=LayerPathParams)


class LayerPathMethod(AttributionMethod[LP]):
    """What layer_integrated_gradients and layer_conductance share: requests with the same layer and steps
    share a batch, inputs go in chunks of the rows per forward (at most `ig_internal_batch_size`), the steps are
    under the setting named by `steps_limit`, and the heatmap is `layer_heatmap`."""

    steps_limit: ClassVar[str]
    chunked = True
    time_advice = "lower steps"

    def chunk(self, params: LP, settings: Settings) -> int:
        return settings.ig_internal_batch_size

    def rows_per_input(self, params: LP) -> int:
        return params.steps + 1

    def lighter(self, params: LP, shape: tuple[int, ...]) -> tuple[LP, str] | None:
        return halved(params, "steps")

    def rows_through(self, params: LP, shape: tuple[int, ...]) -> tuple[int, int]:
        return params.steps + 3, params.steps + 1  # the path's points, the layer's ends and the delta's forwards

    def check_limits(self, params: LP, settings: Settings) -> None:
        limit: int = getattr(settings, self.steps_limit)
        if params.steps > limit:
            raise InvalidField(f"steps {params.steps} is over the limit of {limit} ({self.steps_limit})")

    def resolve_layers(self, params: LP, names: Sequence[str]) -> LP:
        return params.model_copy(update={"layer": resolve_layer(names, params.layer)})

    def batch_key(self, params: LP) -> Hashable:
        return params.layer, params.steps

    def heatmap(self, row: Tensor, x: Tensor) -> Tensor:
        return layer_heatmap(row, x)
