"""Request-scoped capture of layer inputs and outputs (the tensors behind /activations).

Keys: a layer's first call is `name`, its k-th call in the same forward `name#k`; a
tuple/list output adds the element index (`name.0`, `name#2.1`), a dict output its key
(`name.logits`), nested containers both (`name.1.0`); non-tensor elements are skipped.
Inputs are the forward-pre hook's arguments: one positional argument is keyed like an
output (`name`), several get their position (`name.0`, `name.1`), keyword tensors their
keyword (`name.mask`). Every tensor is cloned when its hook fires, so later in-place ops
(e.g. `ReLU(inplace=True)`) cannot change it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from torch import Tensor, nn

from service.errors import InvalidField
from service.introspection.copies import detached_copy
from service.introspection.hooks import HookScope
from service.specs.vocab import Capture

T = TypeVar("T")

Captured = dict[str, dict[str, Tensor]]


def capture_activations(
    model: nn.Module, layer_names: Sequence[str], capture: Capture, run: Callable[[], T]
) -> tuple[T, Captured]:
    """Hook the named layers, call `run()` (the caller's forward), unhook, return its result and captures.

    Captures map a key (module docstring) to `{"output": t}`, `{"input": t}` or both, each a
    detached CPU copy. Hooks live in a `HookScope` and are removed even when `run` raises.
    State is local to the call, so concurrent calls on different models never mix tensors.
    """
    result, captured, _ = capture_by_layer(model, layer_names, capture, run)
    return result, captured


def capture_by_layer(
    model: nn.Module, layer_names: Sequence[str], capture: Capture, run: Callable[[], T]
) -> tuple[T, Captured, dict[str, list[str]]]:
    """As `capture_activations`, plus each layer's keys in firing order (`{layer: [key, ...]}`).

    Batched requests share one forward over the union of their layers and each takes its own
    layers' keys; a key's layer is known here, not guessed from its text (`a.b` may be module
    `a.b` or element `b` of module `a`'s output).
    """
    capture = Capture(capture)  # a plain "both" string works too
    modules = dict(model.named_modules())
    unknown = [name for name in layer_names if name not in modules]
    if unknown:
        raise InvalidField(f"unknown layers: {', '.join(repr(n) for n in unknown)}")
    captured: Captured = {}
    recorders: list[_Recorder] = []
    with HookScope(model) as scope:
        for name in dict.fromkeys(layer_names):
            recorder = _Recorder(name, captured, capture)
            recorders.append(recorder)
            module = modules[name]
            scope.add(module.register_forward_pre_hook(recorder.pre_hook, with_kwargs=True))
            if capture is not Capture.input:
                scope.add(module.register_forward_hook(recorder.hook))
        result = run()
    on_cpu = {key: {side: t.cpu() for side, t in sides.items()} for key, sides in captured.items()}
    return result, on_cpu, {r.name: [key for key in on_cpu if key in r.keys] for r in recorders}


class _Recorder:
    """Hooks of one layer: the pre-hook numbers the call (a stack, so re-entrant calls pair up)."""

    def __init__(self, name: str, captured: Captured, capture: Capture) -> None:
        self.name = name
        self.captured = captured
        self.capture = capture
        self.calls = 0
        self.open: list[str] = []
        self.keys: set[str] = set()

    def pre_hook(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.calls += 1
        base = self.name if self.calls == 1 else f"{self.name}#{self.calls}"
        self.open.append(base)
        if self.capture is Capture.output:
            return
        if len(args) == 1 and not any(isinstance(v, Tensor) for v in kwargs.values()):
            items = flatten_tensors(base, args[0])
        else:
            items = itertools.chain(flatten_tensors(base, args), flatten_tensors(base, kwargs))
        for key, t in items:
            self._store(key, "input", t)

    def hook(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        base = self.open.pop()
        for key, t in flatten_tensors(base, output):
            self._store(key, "output", t)

    def _store(self, key: str, side: str, t: Tensor) -> None:
        self.keys.add(key)
        self.captured.setdefault(key, {})[side] = detached_copy(t)


def flatten_tensors(key: str, value: Any) -> Iterator[tuple[str, Tensor]]:
    """(key, tensor) pairs of a layer's output or arguments; see the module docstring."""
    for found, _, t in tensor_paths(key, value):
        yield found, t


def tensor_paths(key: str, value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[str, tuple[Any, ...], Tensor]]:
    """`flatten_tensors`' pairs, each with the indices (tuple positions, dict keys) that reach its tensor."""
    if isinstance(value, Tensor):
        yield key, path, value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from tensor_paths(f"{key}.{k}", v, (*path, k))
    elif isinstance(value, (tuple, list)):
        for i, v in enumerate(value):
            yield from tensor_paths(f"{key}.{i}", v, (*path, i))


def captured_outputs(captured: Captured) -> dict[str, Tensor]:
    """The output side of each captured key (keys captured as input only are left out)."""
    return {key: sides["output"] for key, sides in captured.items() if "output" in sides}


def captured_tensors(captured: Captured) -> dict[str, Tensor]:
    """Flat `{"<key>:<side>": tensor}`, the tensor names of binary /activations answers."""
    return {f"{key}:{side}": t for key, sides in captured.items() for side, t in sides.items()}
