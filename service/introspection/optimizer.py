"""Optimizer state-dict metadata: hyper-parameters per group and the shapes of per-parameter state."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from service.dtypes import dtype_name
from service.introspection.state_dict import looks_like_buffer


def optimizer_metadata(
    type_name: str | None, state: Mapping[str, Any], param_names: Mapping[int, str] | None
) -> dict[str, Any]:
    """The /optimizer answer from an `optimizer.state_dict()`-shaped mapping.

    Hyper-parameters keep their state-dict names with JSON-friendly values; per-parameter
    state gives `{"shape", "dtype"}` for tensors and a number for scalars (0-d tensors too).
    """
    groups = []
    for group in _mappings(state.get("param_groups")):
        params = list(group.get("params", []))
        hyper = {str(k): _value(v) for k, v in group.items() if k != "params"}
        names = None if param_names is None else [_name(param_names, p) for p in params]
        groups.append(hyper | {"params": [_value(p) for p in params], "param_names": names})
    per_param = state.get("state")
    items = list(per_param.items()) if isinstance(per_param, Mapping) else []
    if all(isinstance(k, int) for k, _ in items):
        items.sort(key=lambda kv: kv[0])
    entries = [
        {
            "param": _value(param),
            "param_name": None if param_names is None else _name(param_names, param),
            "entries": {str(k): _describe(v) for k, v in values.items()} if isinstance(values, Mapping) else {},
        }
        for param, values in items
    ]
    return {"type": type_name, "param_groups": groups, "state": entries}


def param_names_for(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[int, str]:
    """State-dict ids (consecutive over `param_groups`, as `Optimizer.state_dict` numbers them) -> names."""
    by_identity = {id(p): name for name, p in model.named_parameters()}
    params = (p for group in optimizer.param_groups for p in group["params"])
    return {index: by_identity[id(p)] for index, p in enumerate(params) if id(p) in by_identity}


def param_names_from_state_dict(
    opt_state: Mapping[str, Any], model_state_dict_keys: Iterable[str] | Mapping[str, Tensor]
) -> dict[int, str] | None:
    """Ids -> names for a checkpoint, when the optimizer covers exactly the model's parameters in order.

    That is the usual `optimizer(model.parameters())`; parameter-like keys are those that do not
    look like buffers (`looks_like_buffer`, using dtypes when a mapping of tensors is given).
    Otherwise (a subset, tied weights, several models) the names are unknown: None.
    """
    if isinstance(model_state_dict_keys, Mapping):
        keys = [k for k, v in model_state_dict_keys.items() if not looks_like_buffer(k, v)]
    else:
        keys = [k for k in model_state_dict_keys if not looks_like_buffer(k)]
    ids = [p for group in _mappings(opt_state.get("param_groups")) for p in group.get("params", [])]
    if not ids or len(ids) != len(keys) or not all(isinstance(i, int) for i in ids):
        return None
    return dict(zip(ids, keys, strict=True))


def _name(param_names: Mapping[int, str], param: Any) -> str | None:
    return param_names.get(param) if isinstance(param, int) else None


def _mappings(value: Any) -> list[Mapping[str, Any]]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, (list, tuple)) else []


def _describe(value: Any) -> Any:
    """Per-parameter state: tensors with elements to show -> shape and dtype; scalars -> numbers."""
    if isinstance(value, Tensor):
        if value.ndim == 0:
            return _value(float(value.item())) if not value.is_complex() else str(value.item())
        return {"shape": list(value.shape), "dtype": dtype_name(value.dtype)}
    if isinstance(value, (list, tuple)):
        return [_describe(v) for v in value]
    return _value(value)


def _value(value: Any) -> Any:
    """A JSON-friendly copy: tuples -> lists, tensors -> numbers or nested lists, the rest as text."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Tensor):
        return _value(value.detach().cpu().tolist())
    if isinstance(value, (list, tuple)):
        return [_value(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _value(v) for k, v in value.items()}
    return str(value)
