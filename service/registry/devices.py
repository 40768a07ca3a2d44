"""Device and dtype choice: `auto` picks cuda, then mps, then cpu."""

from __future__ import annotations

import torch

from service.errors import ModelLoadError


def pick_device(requested: str) -> torch.device:
    if requested == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(requested)
    except RuntimeError:
        raise ModelLoadError(f"unknown device {requested!r}; use auto, cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ModelLoadError(f"device {requested!r} requested but CUDA is not available")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ModelLoadError(f"device {requested!r}: only {torch.cuda.device_count()} CUDA devices")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise ModelLoadError("device 'mps' requested but MPS is not available")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise ModelLoadError(f"unsupported device {requested!r}")
    return device
