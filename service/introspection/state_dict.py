"""State-dict metadata (key, shape, dtype, size, kind) of a model or of a state dict read from a file."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from service.dtypes import dtype_name
from service.errors import NotFound
from service.introspection.layers import closest_names
from service.introspection.tensor_stats import finite_stats

BUFFER_SUFFIXES = ("running_mean", "running_var", "num_batches_tracked")


def looks_like_buffer(key: str, tensor: Tensor | None = None) -> bool:
    """Guess for a file's state dict: batch-norm statistics and non-floating tensors are buffers."""
    if key.rsplit(".", 1)[-1] in BUFFER_SUFFIXES:
        return True
    return tensor is not None and not (tensor.is_floating_point() or tensor.is_complex())


def state_dict_entries(model: nn.Module, stats: bool) -> dict[str, Any]:
    """The /state-dict answer, in `state_dict()` order; `stats` adds `finite_stats` per entry.

    Tensors are read in place (`keep_vars=True`), never copied; non-tensor extra state is left out.
    """
    params = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    entries = [
        _entry(key, value, "parameter" if key in params else "buffer", value.requires_grad, stats)
        for key, value in model.state_dict(keep_vars=True).items()
        if isinstance(value, Tensor)
    ]
    return _totals(entries)


def checkpoint_state_dict_entries(sd: Mapping[str, Tensor], stats: bool) -> dict[str, Any]:
    """Same shape as `state_dict_entries` for a state dict from a file: kind guessed, requires_grad None."""
    entries = [
        _entry(key, value, "buffer" if looks_like_buffer(key, value) else "parameter", None, stats)
        for key, value in sd.items()
    ]
    return _totals(entries)


def get_tensor(model: nn.Module, key: str) -> Tensor:
    """The state-dict tensor `key`, detached, on the CPU; NotFound (404) naming the closest keys."""
    sd = model.state_dict(keep_vars=True)
    value = sd.get(key)
    if not isinstance(value, Tensor):
        close = closest_names(key, [k for k, v in sd.items() if isinstance(v, Tensor)])
        hint = f"; closest: {', '.join(repr(c) for c in close)}" if close else ""
        raise NotFound(f"no tensor {key!r} in the state dict{hint}")
    return value.detach().cpu()


def _entry(key: str, value: Tensor, kind: str, requires_grad: bool | None, stats: bool) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "key": key,
        "shape": list(value.shape),
        "dtype": dtype_name(value.dtype),
        "numel": value.numel(),
        "bytes": value.numel() * value.element_size(),
        "kind": kind,
        "requires_grad": requires_grad,
    }
    if stats:
        entry |= finite_stats(value)
    return entry


def _totals(entries: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "entries": entries,
        "num_tensors": len(entries),
        "total_numel": sum(e["numel"] for e in entries),
        "total_bytes": sum(e["bytes"] for e in entries),
    }
