"""TorchScript programs: `architecture` is a file under the model dir, as `torch.jit.save` wrote it.

A TorchScript file holds its code and weights; loading it runs no Python from the file (the
program runs in TorchScript's interpreter). Scripted modules refuse Python hooks, so the program is
served as one opaque module (`ScriptProgram`): predictions, the /v2 and gRPC inference and the
TorchServe front work, and so do attributions at the input (gradient, integrated gradients, ...);
its layers are not listed, so layer captures and layer attributions have nothing to name.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from service.errors import HookserveError, ModelLoadError, first_line
from service.registry.paths import resolve_under
from service.registry.sources import register_source
from service.specs.model import ModelSpec, Source


@register_source(Source.torchscript)
def build(spec: ModelSpec, model_dir: Path, pretrained: bool) -> nn.Module:
    if pretrained:
        raise ModelLoadError('weights = "DEFAULT" is only for torchvision and timm models')
    if spec.kwargs:
        raise ModelLoadError("a TorchScript program takes no kwargs: it was built when it was saved")
    try:
        path = resolve_under(model_dir, spec.architecture)
    except HookserveError as exc:
        raise ModelLoadError(str(exc.detail)) from None
    try:
        with warnings.catch_warnings():  # torch deprecates TorchScript for torch.export; its archives are still here
            warnings.simplefilter("ignore", FutureWarning)
            program = torch.jit.load(str(path), map_location="cpu")  # type: ignore[no-untyped-call]
    except (RuntimeError, ValueError) as exc:
        raise ModelLoadError(f"{spec.architecture!r} is not a TorchScript program: {first_line(exc)}") from None
    return ScriptProgram(program)


class ScriptProgram(nn.Module):
    """A TorchScript program as one module: it runs the program, which is not registered as a submodule
    (so no hook is ever put on a scripted module), and moves, casts and re-lays out with it."""

    def __init__(self, program: torch.jit.ScriptModule) -> None:
        super().__init__()
        object.__setattr__(self, "program", program)
        self.program: torch.jit.ScriptModule

    def forward(self, x: torch.Tensor) -> Any:
        return self.program(x)

    def _apply(self, fn: Any, recurse: bool = True) -> ScriptProgram:
        self.program._apply(fn)  # type: ignore[no-untyped-call]
        super()._apply(fn, recurse)  # type: ignore[no-untyped-call]
        return self

    def extra_repr(self) -> str:
        return f"program={self.program.original_name}"
