"""Weights files: bare state dicts, training checkpoints, safetensors. Never runs a pickle."""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from service.errors import ModelLoadError

MODEL_KEYS = ("model_state_dict", "state_dict", "model")
OPTIMIZER_KEYS = ("optimizer_state_dict", "optimizer")


@dataclass(frozen=True)
class WeightsFile:
    """What a weights file held: the model's state dict and, maybe, an optimizer's."""

    model_state: Mapping[str, torch.Tensor]
    optimizer_state: dict[str, Any] | None


def read_weights(path: Path) -> WeightsFile:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return WeightsFile(load_file(str(path), device="cpu"), None)
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, AttributeError, TypeError, EOFError) as exc:
        raise ModelLoadError(
            f"{path.name} could not be read as a weights-only checkpoint ({type(exc).__name__}); "
            "files that need arbitrary code to unpickle are refused"
        ) from None
    return split_checkpoint(obj, path.name)


def split_checkpoint(obj: Any, name: str) -> WeightsFile:
    if not isinstance(obj, Mapping):
        raise ModelLoadError(f"{name} holds a {type(obj).__name__}, not a state dict or checkpoint dict")
    for key in MODEL_KEYS:
        inner = obj.get(key)
        if isinstance(inner, Mapping) and _is_state_dict(inner):
            optimizer = next((obj[k] for k in OPTIMIZER_KEYS if isinstance(obj.get(k), Mapping)), None)
            return WeightsFile(inner, dict(optimizer) if optimizer is not None else None)
    if _is_state_dict(obj):
        return WeightsFile(obj, None)
    raise ModelLoadError(f"{name} has no state dict (looked for a bare one and keys {list(MODEL_KEYS)})")


def _is_state_dict(obj: Mapping[Any, Any]) -> bool:
    return len(obj) > 0 and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items())


def load_into(module: nn.Module, weights: WeightsFile, name: str) -> None:
    try:
        module.load_state_dict(weights.model_state, strict=True)
    except RuntimeError as exc:
        raise ModelLoadError(f"{name} does not match the architecture: {exc}") from None


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict[str, Any], name: str) -> None:
    try:
        optimizer.load_state_dict(state)
    except (ValueError, KeyError, RuntimeError) as exc:
        raise ModelLoadError(f"optimizer state in {name} does not fit the optimizer: {exc}") from None
