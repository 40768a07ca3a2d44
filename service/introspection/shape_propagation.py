"""Every layer's shapes at the request's real sample shape, propagated without computing anything.

Scaling the shapes probed at the model's input size by the input's area is wrong for inputs of
another aspect: a padded convolution does not shrink a 1-pixel dimension, so a `[3, 1, 200000]`
input holds several times what the area says. Here the model runs on the meta device instead:
a copy of its module tree whose parameters and buffers are meta tensors (shapes and dtypes, no
storage) takes a meta sample of the real shape, and the same hooks as the load-time probe
(`shapes.probe_shapes`) record every capture key's input and output shapes. Nothing is
allocated and no arithmetic runs, so a shape that would take gigabytes costs microseconds.

The copy is made once per model (when it is loaded, before any hook can be on it) and answers
are cached per sample shape in a bounded LRU. A model the meta device cannot run (data-dependent
control flow, `.item()`, an op without a meta kernel) gets `ShapesUnknown` with the reason; the
data plane then decides between a real probe and a refusal.
"""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict

import torch
from torch import nn

from service.errors import first_line
from service.introspection.shapes import LayerShapes, probe_shapes

DEFAULT_CAPACITY = 64  # sample shapes remembered per model

_HOOK_DICTS = (
    "_forward_hooks",
    "_forward_pre_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_pre_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_backward_hooks",
    "_backward_pre_hooks",
)


class ShapesUnknown(Exception):
    """The shapes at this sample shape cannot be propagated on the meta device; `reason` says why."""

    def __init__(self, reason: str, *, model_error: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.model_error = model_error  # the model itself refuses inputs of this shape (the real run would fail too)


class ShapePropagation:
    """One model's layer shapes at any sample shape: a meta copy of its module, and an LRU of the answers."""

    def __init__(self, module: nn.Module, at_input: LayerShapes, capacity: int = DEFAULT_CAPACITY) -> None:
        self.at_input = at_input  # the load-time probe, at the model's input size
        self.capacity = capacity
        self._meta, self._why_not = _meta_copy(module)
        self._dtype = next((p.dtype for p in module.parameters() if p.is_floating_point()), torch.float32)
        self._cache: OrderedDict[tuple[int, ...], LayerShapes | ShapesUnknown] = OrderedDict()
        self._lock = threading.Lock()  # one propagation at a time: the hooks are on the shared meta copy

    def at(self, sample: tuple[int, ...]) -> LayerShapes:
        """The layer shapes for samples of shape `sample` (no batch dimension), or `ShapesUnknown`."""
        if sample == self.at_input.probe:
            return self.at_input
        with self._lock:
            found = self._cache.get(sample)
            if found is None:
                found = self._propagate(sample)
                self._cache[sample] = found
                while len(self._cache) > self.capacity:
                    self._cache.popitem(last=False)
            else:
                self._cache.move_to_end(sample)
        if isinstance(found, ShapesUnknown):
            raise found
        return found

    def remember(self, sample: tuple[int, ...], shapes: LayerShapes) -> None:
        """Keep shapes found another way (a real probe) for `sample`."""
        shapes.area = _growth(shapes, self.at_input)
        with self._lock:
            self._cache[sample] = shapes
            while len(self._cache) > self.capacity:
                self._cache.popitem(last=False)

    @property
    def cached(self) -> int:
        return len(self._cache)

    def _propagate(self, sample: tuple[int, ...]) -> LayerShapes | ShapesUnknown:
        if self._meta is None:
            return ShapesUnknown(f"the model cannot be copied to the meta device ({self._why_not})")
        x = torch.empty((1, *sample), dtype=self._dtype, device="meta")
        try:
            found = probe_shapes(self._meta, x, self._meta)
        except NotImplementedError as exc:  # before RuntimeError, its base
            return ShapesUnknown(f"an operation has no meta kernel ({first_line(exc)})")
        except Exception as exc:  # the model's own code on meta tensors may fail any way: never a 500
            return ShapesUnknown(first_line(exc), model_error=_is_shape_error(exc))
        found.area = _growth(found, self.at_input)
        return found


def _meta_copy(module: nn.Module) -> tuple[nn.Module | None, str]:
    """A copy of the module tree with meta parameters and buffers and no hooks: (copy, "") or (None, why not).

    A deep copy where the module can be copied; else (it holds a lock, an event, a handle) a copy of the tree's
    module objects alone, sharing every other attribute with the served module."""
    meta_of = _meta_tensors(module)
    try:
        meta: nn.Module = copy.deepcopy(module, dict(meta_of))
    except Exception as deep:  # something uncopyable: copy the module objects alone
        try:
            meta = _shallow_tree(module, meta_of, {})
        except Exception as shallow:
            return None, f"{first_line(deep)}; {first_line(shallow)}"
    for sub in meta.modules():
        for name in _HOOK_DICTS:
            hooks = getattr(sub, name, None)
            if hooks is not None:
                hooks.clear()
    return meta, ""


def _meta_tensors(module: nn.Module) -> dict[int, object]:
    """Each parameter's and buffer's meta twin, by the id of the real one."""
    meta_of: dict[int, object] = {}
    for p in module.parameters():
        meta_of[id(p)] = nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad)
    for b in module.buffers():
        meta_of[id(b)] = torch.empty_like(b, device="meta")
    return meta_of


def _shallow_tree(module: nn.Module, meta_of: dict[int, object], done: dict[int, nn.Module]) -> nn.Module:
    """New module objects (a shared submodule stays shared), their tensors meta, every other attribute shared."""
    if id(module) in done:
        return done[id(module)]
    clone = copy.copy(module)
    done[id(module)] = clone
    clone._parameters = {k: None if v is None else meta_of[id(v)] for k, v in module._parameters.items()}  # type: ignore[misc]
    clone._buffers = {k: None if v is None else meta_of[id(v)] for k, v in module._buffers.items()}  # type: ignore[misc]
    clone._modules = {k: None if v is None else _shallow_tree(v, meta_of, done) for k, v in module._modules.items()}
    for name in _HOOK_DICTS:
        if hasattr(module, name):
            setattr(clone, name, OrderedDict())
    return clone


_SHAPE_WORDS = ("size", "shape", "kernel", "dimension", "mat1", "mat2", "reduction dim", "match", "divisible")


def _is_shape_error(exc: Exception) -> bool:
    """Whether the meta run failed because the input's shape does not fit the model (as a real run would): the
    message of a shape check (torch's, or a model's own assertion on its input size), not of the meta device."""
    text = str(exc).lower()
    if any(word in text for word in ("meta", "fake", "data-dependent", ".item()")):
        return False
    return any(word in text for word in _SHAPE_WORDS)


def _growth(found: LayerShapes, at_input: LayerShapes) -> float:
    """How much more one sample's layer outputs hold than at the model's input size (scales functional nodes)."""
    base = at_input.output_bytes()
    return found.output_bytes() / base if base else 1.0
