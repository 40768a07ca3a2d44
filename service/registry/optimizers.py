"""The optimizer a model is served with: configured, or an SGD to hold a checkpoint's optimizer state."""

from __future__ import annotations

import torch
from torch import nn

from service.errors import ModelLoadError
from service.specs.model import ModelSpec


def build_optimizer(spec: ModelSpec, module: nn.Module, needed: bool) -> torch.optim.Optimizer | None:
    """The configured optimizer, or an SGD when a checkpoint brings optimizer state and none is set."""
    if spec.optimizer is None:
        return torch.optim.SGD(module.parameters(), lr=1e-3) if needed else None
    cls = getattr(torch.optim, spec.optimizer.type, None)
    if not isinstance(cls, type) or not issubclass(cls, torch.optim.Optimizer):
        raise ModelLoadError(f"torch.optim has no optimizer {spec.optimizer.type!r}")
    try:
        optimizer: torch.optim.Optimizer = cls(module.parameters(), **spec.optimizer.kwargs())
    except (TypeError, ValueError) as exc:
        raise ModelLoadError(f"optimizer {spec.optimizer.type}: {exc}") from None
    return optimizer
