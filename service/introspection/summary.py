"""torchinfo's model summary as data: the rows it prints at a depth, its totals and size estimates.

The numbers are torchinfo's own (`torchinfo.summary`, read back from its `ModelStatistics`);
we only map each row to its module path and leave the model exactly as it was.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from typing import Any

import torch
import torchinfo
import torchinfo.torchinfo as torchinfo_impl
from torch import nn

from service.errors import InvalidField, first_line

_MAX_ERROR = 300


def summarize(
    model: nn.Module,
    input_size: Sequence[int],
    depth: int,
    device: torch.device,
    dtype: torch.dtype,
) -> dict[str, Any]:
    """The /summary answer for one input of shape `input_size` (batch dim included) at `depth`.

    `device` must be where the model lives (torchinfo calls `model.to(device)`). The forward
    runs in eval mode (no batch-norm statistics move) and every module's train/eval flag is
    restored afterwards. The input comes from a private seeded generator (global RNG untouched);
    torchinfo's numbers equal those of `torchinfo.summary(model, input_size=...)`. A forward
    that fails for this input size is a 422.
    """
    size = _check_input_size(input_size)
    if depth < 0:
        raise InvalidField("depth must be >= 0")
    _check_device(model, device)
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(size, generator=generator).to(device=device, dtype=dtype)
    modes = {module: module.training for module in model.modules()}
    try:
        stats = torchinfo.summary(model, input_data=[x], depth=depth, device=device, mode="eval", verbose=0)
    except RuntimeError as exc:
        cause = exc.__cause__ or exc
        if isinstance(cause, torch.OutOfMemoryError):
            raise cause from None
        reason = first_line(cause)[:_MAX_ERROR]
        raise InvalidField(f"the model's forward failed for input_size {list(size)}: {reason}") from None
    finally:
        for module, training in modes.items():
            module.training = training
        # torchinfo keeps every summary_list (and so the model) in a module-level cache.
        torchinfo_impl._cached_forward_pass.pop(type(model).__name__, None)
    return _as_dict(model, stats, depth)


def _as_dict(model: nn.Module, stats: Any, depth: int) -> dict[str, Any]:
    names: dict[int, str] = {}
    for name, module in model.named_modules():
        names.setdefault(id(module), name)
    rows = []
    for info in stats.summary_list:
        if info.depth > depth:  # the filter of torchinfo's FormattingOptions.layers_to_str
            continue
        at_max_depth = info.depth == depth
        rows.append(
            {
                "name": names.get(info.layer_id, info.var_name),
                "type": info.class_name,
                "depth": info.depth,
                "depth_index": info.depth_index,
                "output_shape": _shape(info.output_size),
                "num_parameters": _row_params(info, at_max_depth),
                "mult_adds": _row_macs(info, at_max_depth),
                "recursive": info.is_recursive,
            }
        )
    total_input, output_bytes, param_bytes = stats.total_input, stats.total_output_bytes, stats.total_param_bytes
    return {
        "rows": rows,
        "total_params": stats.total_params,
        "trainable_params": stats.trainable_params,
        "non_trainable_params": stats.total_params - stats.trainable_params,
        "total_mult_adds": stats.total_mult_adds,
        "input_size_mb": stats.to_megabytes(total_input),
        "forward_backward_pass_size_mb": stats.to_megabytes(output_bytes),
        "params_size_mb": stats.to_megabytes(param_bytes),
        "estimated_total_size_mb": stats.to_megabytes(total_input + output_bytes + param_bytes),
        "text": _units_as_torchinfo_means(str(stats)),
    }


def _units_as_torchinfo_means(text: str) -> str:
    """`Total mult-adds (M)`: torchinfo formats its `Units` (a str Enum) with an f-string, which Python 3.11 renders
    as `(Units.MEGABYTES)`; its value is what torchinfo means there."""
    return re.sub(r"\(Units\.(\w+)\)", lambda m: f"({torchinfo.Units[m.group(1)].value})", text)


def _row_params(info: Any, at_max_depth: bool) -> int:
    """The number in torchinfo's "Param #" column (LayerInfo.num_params_to_str), 0 for "--"/"(recursive)"."""
    if info.num_params == 0 or info.is_recursive:
        return 0
    if at_max_depth or info.is_leaf_layer:
        return int(info.num_params)
    return max(int(info.leftover_params()), 0)


def _row_macs(info: Any, at_max_depth: bool) -> int:
    """The number in torchinfo's "Mult-Adds" column (LayerInfo.macs_to_str), 0 for "--"."""
    if info.macs <= 0:
        return 0
    if info.is_leaf_layer:
        return int(info.macs)
    if at_max_depth:
        return int(sum(child.macs for child in info.children if child.is_leaf_layer))
    return 0


def _shape(size: Any) -> list[Any]:
    return [_shape(s) if isinstance(s, (list, tuple)) else int(s) for s in size]


def _check_input_size(input_size: Sequence[int]) -> tuple[int, ...]:
    size = tuple(input_size)
    if not size or any(not isinstance(s, int) or isinstance(s, bool) or s <= 0 for s in size):
        raise InvalidField("input_size must be a non-empty list of positive integers, e.g. 1,3,224,224")
    return size


def _check_device(model: nn.Module, device: torch.device) -> None:
    """Refuse a device other than the model's: torchinfo would move the served model there."""
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    for tensor in itertools.chain(model.parameters(), model.buffers()):
        here = tensor.device
        if here.type != device.type or (device.type == "cuda" and here.index != device.index):
            raise ValueError(f"summarize: the model is on {here}, not {device}")
