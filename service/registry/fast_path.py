"""The prediction path: a copy of the model that plain predictions run on, apart from the module hooks see.

With `fuse` (the default), BatchNorm layers are folded into the convolutions (and linear
layers) before them in an FX-traced copy: one fewer pass over every feature map per layer.
The copy is kept only when something was folded and its outputs on a seeded random batch stay
within 1e-4 of the model's; otherwise predictions run on the model itself. With `compile`, the
copy (fused or plain) is `torch.compile`d. The served module is never changed: `/layers`,
summaries and every hooked request see it as configured, and no hook ever fires for a prediction.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass

import torch
from torch import fx, nn
from torch.fx.experimental.optimization import fuse
from torch.nn.modules.batchnorm import _BatchNorm

from service.errors import first_line
from service.introspection.fx_tracing import symbolic_trace
from service.specs.model import ModelSpec

COMPILE_BACKEND = "inductor"
TOLERANCE = 1e-4
log = logging.getLogger("hookserve.loader")


@dataclass(frozen=True)
class Placement:
    """Where and how the model runs: a probe batch is built to match."""

    input_size: list[int]
    device: torch.device
    dtype: torch.dtype
    nhwc: bool  # channels_last

    def probe(self, batch: int) -> torch.Tensor:
        """A seeded random batch of the model's input size, dtype, device and memory format."""
        x = torch.randn((batch, *self.input_size), generator=torch.Generator().manual_seed(0))
        x = x.to(device=self.device, dtype=self.dtype)
        return x.contiguous(memory_format=torch.channels_last) if self.nhwc and x.ndim == 4 else x


@dataclass(frozen=True)
class PredictionPath:
    module: nn.Module | None  # None: predictions run on the served module
    name: str  # "fused", "compiled", "fused+compiled" or "eager"
    reason: str = ""  # why there is no fused copy, when there is none


def prediction_path(spec: ModelSpec, module: nn.Module, placement: Placement) -> PredictionPath:
    """Build the model's prediction path (see the module docstring)."""
    fused, reason = fused_copy(module, placement) if spec.fuse else (None, "fuse = false")
    if spec.compile:
        base = fused if fused is not None else copy.deepcopy(module)
        compiled = compile_module(base, placement)
        return PredictionPath(compiled, "fused+compiled" if fused is not None else "compiled", reason)
    if fused is not None:
        return PredictionPath(fused, "fused")
    return PredictionPath(None, "eager", reason)


def fused_copy(module: nn.Module, placement: Placement) -> tuple[nn.Module | None, str]:
    """An FX copy with BatchNorm folded, or (None, why not)."""
    norms = sum(isinstance(m, _BatchNorm) for m in module.modules())
    if norms == 0:
        return None, "no BatchNorm to fold"
    try:
        fused: fx.GraphModule = fuse(symbolic_trace(module), inplace=False, no_trace=True)  # type: ignore[assignment]
    except Exception as exc:  # untraceable forwards (data-dependent control flow...) keep the eager path
        return None, f"FX cannot trace it ({first_line(exc)})"
    left = sum(
        1 for n in fused.graph.nodes if n.op == "call_module" and isinstance(fused.get_submodule(n.target), _BatchNorm)
    )
    if left == norms:
        return None, "no BatchNorm follows a convolution or linear layer it could fold into"
    fused.eval()
    if placement.nhwc:
        fused.to(memory_format=torch.channels_last)
    if not _same_outputs(module, fused, placement):
        return None, f"the folded copy's outputs differ by more than {TOLERANCE:g}"
    log.info("prediction path: %d of %d BatchNorm layers folded", norms - left, norms)
    return fused, ""


def compile_module(module: nn.Module, placement: Placement) -> nn.Module:
    """`torch.compile` for plain predictions (batch size dynamic), compiled now rather than on a request."""
    compiled: nn.Module = torch.compile(module, dynamic=True, backend=COMPILE_BACKEND)  # type: ignore[assignment]
    with torch.inference_mode():
        compiled(placement.probe(1))
    return compiled


def _same_outputs(module: nn.Module, other: nn.Module, placement: Placement) -> bool:
    x = placement.probe(2)
    with torch.inference_mode():
        want, got = _tensors(module(x)), _tensors(other(x))
    return len(want) == len(got) and all(
        w.shape == g.shape and torch.allclose(g.float(), w.float(), rtol=TOLERANCE, atol=TOLERANCE)
        for w, g in zip(want, got, strict=True)
    )


def _tensors(output: object) -> list[torch.Tensor]:
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, dict):
        return [t for v in output.values() for t in _tensors(v)]
    if isinstance(output, (list, tuple)):
        return [t for v in output for t in _tensors(v)]
    return []
