"""Gradients of a target class score w.r.t. named layer outputs and the model input.

One forward of the whole batch, score = sum_i logits[i, t_i], one `torch.autograd.grad`
call: rows are independent in eval mode, so row i of each gradient is d logits[i, t_i].
Parameters are never touched (no `.backward()`, no `param.grad`, no `requires_grad_`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from service.errors import InvalidField
from service.introspection.hooks import HookScope
from service.introspection.layers import closest_names
from service.introspection.targets import TargetSpec, class_scores, resolve_targets, target_scores

INPUT_KEY = "input"

_PreHook = Callable[[nn.Module, Any], None]
_Hook = Callable[[nn.Module, Any, Any], Any]


@dataclass
class GradientResult:
    """Resolved targets, their logits, and gradients keyed like /activations (plus `input`)."""

    targets: list[int]
    scores: list[float]
    gradients: dict[str, Tensor] = field(default_factory=dict)


class _Keeper:
    """Forward hooks that keep each call's output for autograd and hand a clone downstream.

    Downstream in-place ops (ResNet's `ReLU(inplace=True)`) then modify the clone, so the
    kept tensor stays the layer's own output and its gradient is d score / d output. Calls
    are numbered in a forward-pre hook and keys follow `capture.py` (`name#2`, `name.0`).
    With `grad_from_first`, the forward runs without autograd until the first kept output,
    which becomes a leaf: only the graph downstream of the earliest requested layer is built.
    """

    def __init__(self, grad_from_first: bool = False) -> None:
        self.kept: dict[str, Tensor] = {}
        self.order: dict[str, list[str]] = {}
        self.grad_from_first = grad_from_first

    def hooks(self, name: str) -> tuple[_PreHook, _Hook]:
        self.order[name] = []
        calls = [0]
        open_calls: list[str] = []

        def number(module: nn.Module, args: object) -> None:
            calls[0] += 1
            open_calls.append(name if calls[0] == 1 else f"{name}#{calls[0]}")

        def keep(module: nn.Module, args: object, output: object) -> object:
            if self.grad_from_first:
                torch.set_grad_enabled(True)  # from here on the forward builds a graph (restored by the caller)
            return self._track(name, open_calls.pop(), output)

        return number, keep

    def _track(self, name: str, key: str, value: object) -> object:
        """The same structure with every floating tensor kept under its key and replaced by a clone."""
        if isinstance(value, Tensor):
            return self._track_tensor(name, key, value)
        if isinstance(value, Mapping):
            items = {k: self._track(name, f"{key}.{k}", v) for k, v in value.items()}
            return items if type(value) is dict else _rebuild(value, items)
        if isinstance(value, (tuple, list)):
            elements = [self._track(name, f"{key}.{i}", v) for i, v in enumerate(value)]
            if isinstance(value, list):
                return elements
            if hasattr(value, "_fields"):  # a namedtuple keeps its type
                return type(value)(*elements)  # type: ignore[arg-type]
            return tuple(elements)
        return value

    def _track_tensor(self, name: str, key: str, tensor: Tensor) -> Tensor:
        if not (tensor.is_floating_point() or tensor.is_complex()):
            return tensor
        if not tensor.requires_grad:  # constant w.r.t. input and parameters: make it a leaf
            tensor = tensor.detach().requires_grad_(True)
        self.kept[key] = tensor
        self.order[name].append(key)
        return tensor.clone()


def _rebuild(original: Mapping[Any, object], items: dict[Any, object]) -> object:
    """A mapping of `original`'s type holding `items`, or a plain dict when that type cannot be built so."""
    try:
        return type(original)(items)  # type: ignore[call-arg]
    except Exception:
        return items


@dataclass
class LayerGradients:
    """One forward and backward over a batch: logits, resolved targets, and what was differentiated.

    `kept[key]` is a layer output (or the input under `INPUT_KEY`) and `gradients[key]` its
    gradient; `keys[layer]` lists the layer's keys in forward order (empty: it did not run or
    gave no floating-point tensor).
    """

    logits: Tensor
    targets: list[int]
    scores: Tensor
    kept: dict[str, Tensor]
    gradients: dict[str, Tensor]
    keys: dict[str, list[str]]


def layer_gradients(
    model: nn.Module,
    x: Tensor,
    layer_names: Sequence[str],
    resolve: Callable[[Tensor], list[int]],
    *,
    include_input: bool,
) -> LayerGradients:
    """d(sum of each row's target logit)/d(named layer outputs, and the input when asked), in one pass.

    `resolve(logits)` picks one class per row. Rows are independent in eval mode, so row i of
    each gradient is d logits[i, t_i]. Autograd runs only where it is needed: from the input
    when its gradient is asked for, else from the earliest named layer's output on.
    Parameters are never touched (no `.backward()`, no `param.grad`, no `requires_grad_`).
    """
    names = list(dict.fromkeys(layer_names))
    modules = {name: find_layer(model, name) for name in names}
    if include_input and not x.is_floating_point():
        raise InvalidField(f"the input ({x.dtype}) is not differentiable; set include_input to false")
    keeper = _Keeper(grad_from_first=not include_input)
    with torch.inference_mode(False), HookScope(model) as scope:
        inputs = x.detach().clone()
        if include_input:
            inputs.requires_grad_(True)
        for name, module in modules.items():
            number, keep = keeper.hooks(name)
            scope.add(module.register_forward_pre_hook(number))
            scope.add(module.register_forward_hook(keep))
        with torch.set_grad_enabled(include_input):  # a kept layer output turns it on (see _Keeper)
            output = model(inputs)
        with torch.enable_grad():
            logits = class_scores(output)
            targets = resolve(logits)
            scores = target_scores(logits, targets)
            keys = list(keeper.kept)  # forward order, as /activations lists them
            wrt = [keeper.kept[key] for key in keys]
            if include_input:
                keys.append(INPUT_KEY)
                wrt.append(inputs)
            grads: Sequence[Tensor] = ()
            if wrt:
                if not scores.requires_grad:
                    raise InvalidField("the model's output does not depend on anything differentiable")
                grads = torch.autograd.grad(scores.sum(), wrt, allow_unused=True, materialize_grads=True)
    kept = {key: t.detach() for key, t in zip(keys, wrt, strict=True)}
    return LayerGradients(
        logits=logits.detach(),
        targets=targets,
        scores=scores.detach(),
        kept=kept,
        gradients={key: grad.detach() for key, grad in zip(keys, grads, strict=True)},
        keys={name: list(keeper.order.get(name, [])) for name in names},
    )


def compute_gradients(
    model: nn.Module,
    x: Tensor,
    layer_names: Sequence[str],
    *,
    target: TargetSpec,
    labels: Sequence[str] | None,
    include_input: bool,
) -> GradientResult:
    """d(logit of target)/d(each named layer's outputs) and, when asked, d/d(input), per input row.

    `x` is a batch `[N, ...]` on the model's device; gradients come back detached on that device.
    """
    found = layer_gradients(
        model, x, layer_names, lambda logits: resolve_targets(target, logits, labels), include_input=include_input
    )
    for name in dict.fromkeys(layer_names):
        check_ran(name, found.keys[name])
    return GradientResult(
        targets=found.targets,
        scores=[float(s) for s in found.scores.float().tolist()],
        gradients=found.gradients,
    )


def find_layer(model: nn.Module, name: str) -> nn.Module:
    """The submodule called `name` (as in `named_modules()`), else InvalidField naming the closest."""
    names = [n for n, _ in model.named_modules()]
    if name in names:
        return model.get_submodule(name)
    close = closest_names(name, names)
    hint = f"; closest: {', '.join(repr(c) for c in close)}" if close else ""
    raise InvalidField(f"unknown layer {name!r}{hint} (GET /models/{{name}}/layers lists them)")


def check_ran(name: str, keys: Sequence[str]) -> None:
    """Refuse a layer that did not run or gave no floating-point tensor (it has no keys)."""
    if not keys:
        raise InvalidField(
            f"layer {name!r} produced no differentiable tensor in the forward pass "
            "(it did not run, or its output is not a floating-point tensor)"
        )
