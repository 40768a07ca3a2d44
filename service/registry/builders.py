"""Architecture builders: torchvision, timm and plain Python classes."""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from service.errors import HookserveError, ModelLoadError
from service.registry.paths import resolve_under
from service.specs.model import ModelSpec, Source

DEFAULT_WEIGHTS = "DEFAULT"


def build_module(spec: ModelSpec, model_dir: Path, allow_downloads: bool) -> nn.Module:
    """Instantiate the architecture; pretrained weights only for "DEFAULT" with downloads on."""
    pretrained = spec.weights == DEFAULT_WEIGHTS
    if pretrained and not allow_downloads:
        raise ModelLoadError(
            'weights = "DEFAULT" needs downloads, which are disabled; set HOOKSERVE_ALLOW_DOWNLOADS=true '
            "or point weights at a local file under the model dir"
        )
    if spec.source is Source.torchvision:
        return _torchvision(spec.architecture, pretrained, spec.kwargs)
    if spec.source is Source.timm:
        return _timm(spec.architecture, pretrained, spec.kwargs)
    if pretrained:
        raise ModelLoadError('weights = "DEFAULT" is only for torchvision and timm models')
    return _python(spec.architecture, spec.kwargs, model_dir)


def _torchvision(name: str, pretrained: bool, kwargs: dict[str, Any]) -> nn.Module:
    import torchvision

    known = torchvision.models.list_models()
    if name not in known:
        raise ModelLoadError(f"torchvision has no model {name!r}; closest: {_closest(name, known)}")
    module: nn.Module = torchvision.models.get_model(name, weights="DEFAULT" if pretrained else None, **kwargs)
    return module


def _timm(name: str, pretrained: bool, kwargs: dict[str, Any]) -> nn.Module:
    import timm

    if not timm.is_model(name):
        raise ModelLoadError(f"timm has no model {name!r}; closest: {_closest(name, timm.list_models())}")
    module: nn.Module = timm.create_model(name, pretrained=pretrained, **kwargs)
    return module


def _python(target: str, kwargs: dict[str, Any], model_dir: Path) -> nn.Module:
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
    module: nn.Module = cls(**kwargs)
    return module


def _closest(name: str, known: list[str]) -> list[str]:
    return difflib.get_close_matches(name, known, n=5, cutoff=0.5)


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
