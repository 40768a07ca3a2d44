"""Plain `nn.Module` classes: `pkg.module:Class` (importable) or `file.py:Class` (a file under the model dir)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from torch import nn

from service.errors import HookserveError, ModelLoadError
from service.registry.paths import resolve_under
from service.registry.sources import register_source
from service.specs.model import ModelSpec, Source


@register_source(Source.python)
def build(spec: ModelSpec, model_dir: Path, pretrained: bool) -> nn.Module:
    if pretrained:
        raise ModelLoadError('weights = "DEFAULT" is only for torchvision and timm models')
    target = spec.architecture
    location, sep, class_name = target.rpartition(":")
    if not sep or not location or not class_name:
        raise ModelLoadError(f"python architecture {target!r} must be 'pkg.module:Class' or 'file.py:Class'")
    if location.endswith(".py"):
        try:
            path = resolve_under(model_dir, location)
        except HookserveError as exc:
            raise ModelLoadError(str(exc.detail)) from None
        module_name = f"hookserve_user_{abs(hash(str(path)))}"
        file_spec = importlib.util.spec_from_file_location(module_name, path)
        if file_spec is None or file_spec.loader is None:
            raise ModelLoadError(f"cannot import {location!r}")
        pymod = importlib.util.module_from_spec(file_spec)
        sys.modules[module_name] = pymod
        file_spec.loader.exec_module(pymod)
    else:
        try:
            pymod = importlib.import_module(location)
        except ImportError as exc:
            raise ModelLoadError(f"cannot import module {location!r}: {exc}") from None
    cls = getattr(pymod, class_name, None)
    if not isinstance(cls, type) or not issubclass(cls, nn.Module):
        raise ModelLoadError(f"{target!r} is not an nn.Module class")
    module: nn.Module = cls(**spec.kwargs)
    return module
