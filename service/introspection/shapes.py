"""What every layer takes and gives for one sample: shapes and dtypes per capture key, without keeping tensors.

One forward of a single sample with hooks on every module (removed in `finally`) records, per
key as `capture.py` names them (`name`, `name#2`, `name.0`), the input and output shapes with
their batch dimension of 1. Costs of requests are estimated from these before any work.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from service.introspection.capture import flatten_tensors
from service.introspection.hooks import HookScope


@dataclass(frozen=True)
class TensorShape:
    shape: tuple[int, ...]  # batch dimension included (1 in the probe)
    itemsize: int
    area: float = 1.0  # the request's input area over the probe's: tensors with spatial (or token) dims scale by it

    @property
    def per_sample_numel(self) -> int:
        """Elements of one sample's slice (the whole tensor when its first dimension is not the batch)."""
        numel = 1
        for size in self.shape[1:] if self.shape and self.shape[0] == 1 else self.shape:
            numel *= size
        return int(numel * (self.area if len(self.shape) >= 3 else 1.0))

    @property
    def per_sample_bytes(self) -> int:
        return self.per_sample_numel * self.itemsize


@dataclass
class LayerShapes:
    """Per capture key, in firing order: its output and input shapes; which layer each key belongs to.

    Probed once per model at its input size; `at(sample)` scales them to another input size
    (convolutional feature maps and token sequences grow with the input's area).
    """

    outputs: dict[str, list[TensorShape]] = field(default_factory=dict)
    inputs: dict[str, list[TensorShape]] = field(default_factory=dict)
    layer_of: dict[str, str] = field(default_factory=dict)
    probe: tuple[int, ...] = ()  # the sample shape probed
    area: float = 1.0  # the input area these shapes are scaled to, over the probe's

    def at(self, sample: tuple[int, ...]) -> LayerShapes:
        """These shapes for samples of shape `sample` (no batch dimension)."""
        area = _area(sample) / _area(self.probe) if self.probe and len(sample) >= 3 else 1.0
        if area == 1.0:
            return self

        def scaled(table: dict[str, list[TensorShape]]) -> dict[str, list[TensorShape]]:
            return {k: [TensorShape(t.shape, t.itemsize, area) for t in v] for k, v in table.items()}

        return LayerShapes(scaled(self.outputs), scaled(self.inputs), self.layer_of, self.probe, area)

    def keys_of(self, layers: list[str] | tuple[str, ...]) -> list[str]:
        wanted = set(layers)
        return [key for key, layer in self.layer_of.items() if layer in wanted]

    def output_bytes(self, keys: list[str] | None = None) -> int:
        """Per-sample bytes of the outputs of `keys` (default every key)."""
        chosen = self.outputs if keys is None else {k: self.outputs.get(k, []) for k in keys}
        return sum(t.per_sample_bytes for shapes in chosen.values() for t in shapes)

    def input_bytes(self, keys: list[str]) -> int:
        return sum(t.per_sample_bytes for k in keys for t in self.inputs.get(k, []))

    def largest_output_bytes(self) -> int:
        return max((t.per_sample_bytes for shapes in self.outputs.values() for t in shapes), default=0)

    def numel(self, keys: list[str], sides: tuple[str, ...]) -> int:
        total = 0
        for side in sides:
            table = self.outputs if side == "output" else self.inputs
            total += sum(t.per_sample_numel for k in keys for t in table.get(k, []))
        return total


def probe_shapes(model: nn.Module, sample: Tensor, run: Callable[[Tensor], Any]) -> LayerShapes:
    """Hook every module, call `run(sample)` (a forward of one sample `[1, ...]`), return the shapes seen."""
    found = LayerShapes(probe=tuple(int(s) for s in sample.shape[1:]))
    with HookScope(model) as scope:
        for name, module in model.named_modules():
            recorder = _ShapeRecorder(name, found)
            scope.add(module.register_forward_pre_hook(recorder.pre_hook, with_kwargs=True))
            scope.add(module.register_forward_hook(recorder.hook))
        with torch.inference_mode():
            run(sample)
    return found


class _ShapeRecorder:
    """One module's hooks: numbered calls (a stack, so re-entrant calls pair up), shapes only."""

    def __init__(self, name: str, found: LayerShapes) -> None:
        self.name = name
        self.found = found
        self.calls = 0
        self.open: list[str] = []

    def pre_hook(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.calls += 1
        key = self.name if self.calls == 1 else f"{self.name}#{self.calls}"
        self.open.append(key)
        self.found.layer_of[key] = self.name
        self.found.inputs[key] = [_shape(t) for _, t in flatten_tensors(key, (args, kwargs))]

    def hook(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        key = self.open.pop()
        self.found.outputs[key] = [_shape(t) for _, t in flatten_tensors(key, output)]


def _area(sample: tuple[int, ...]) -> float:
    """The product of the spatial dims (everything after the channels)."""
    area = 1
    for size in sample[1:]:
        area *= size
    return float(max(1, area))


def _shape(t: Tensor) -> TensorShape:
    return TensorShape(tuple(int(s) for s in t.shape), t.element_size())
