"""The prediction path: a copy of the model that plain predictions run on, apart from the module hooks see.

A float32 CPU model runs its predictions on ONNX Runtime (`onnxruntime`, on by default; see
`onnx_path`) when its graph exports and agrees with the model; the torch copy below then
serves only inputs of another shape. With `fuse` (the default), BatchNorm layers are folded
into the convolutions (and linear layers) before them in an FX-traced copy: one fewer pass
over every feature map per layer. The copy is kept only when something was folded and its
outputs on a seeded random batch stay within 1e-4 of the model's; otherwise predictions run on
the model itself. With `compile`, the copy (fused or plain) is `torch.compile`d, and ONNX
Runtime is not tried. The served module is never changed: `/layers`, summaries and every hooked
request see it as configured, and no hook ever fires for a prediction.
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
from service.registry.onnx_path import onnxruntime_copy
from service.registry.probes import TOLERANCE, Placement, same_outputs
from service.specs.model import ModelSpec

COMPILE_BACKEND = "inductor"
log = logging.getLogger("hookserve.loader")


@dataclass(frozen=True)
class PathDefaults:
    """What the server decides for the prediction paths of the models it loads."""

    onnxruntime: bool = True  # for models whose config leaves `onnxruntime` unset
    wide_threads: int = 1  # intra-op threads of a job that runs alone (Settings.torch_threads)
    packed_convolutions: bool = True  # for models whose config leaves `packed_convolutions` unset


DEFAULT_PATHS = PathDefaults()


@dataclass(frozen=True)
class PredictionPath:
    module: nn.Module | None  # None: predictions run on the served module
    name: str  # "onnxruntime", "fused", "compiled", "fused+compiled" or "eager"
    reason: str = ""  # why there is no faster copy, when there is none


def prediction_path(
    spec: ModelSpec, module: nn.Module, placement: Placement, defaults: PathDefaults = DEFAULT_PATHS
) -> PredictionPath:
    """Build the model's prediction path (see the module docstring)."""
    fused, reason = fused_copy(module, placement) if spec.fuse else (None, "fuse = false")
    if spec.compile:
        base = fused if fused is not None else copy.deepcopy(module)
        compiled = compile_module(base, placement)
        return PredictionPath(compiled, "fused+compiled" if fused is not None else "compiled", reason)
    if spec.onnxruntime if spec.onnxruntime is not None else defaults.onnxruntime:
        runtime, why = onnxruntime_copy(module, placement, fused, defaults.wide_threads)
        if runtime is not None:
            return PredictionPath(runtime, "onnxruntime")
        log.info("prediction path: not ONNX Runtime, as %s", why)
        reason = f"{reason}; not ONNX Runtime: {why}" if reason else f"not ONNX Runtime: {why}"
    if fused is not None:
        return PredictionPath(fused, "fused", reason)
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
    if not same_outputs(module, fused, placement.probe(2)):
        return None, f"the folded copy's outputs differ by more than {TOLERANCE:g}"
    log.info("prediction path: %d of %d BatchNorm layers folded", norms - left, norms)
    return fused, ""


def compile_module(module: nn.Module, placement: Placement) -> nn.Module:
    """`torch.compile` for plain predictions (batch size dynamic), compiled now rather than on a request."""
    compiled: nn.Module = torch.compile(module, dynamic=True, backend=COMPILE_BACKEND)  # type: ignore[assignment]
    with torch.inference_mode():
        compiled(placement.probe(1))
    return compiled
