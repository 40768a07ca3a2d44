"""Where architectures come from: one module per `Source`, each registering its builder.

Adding a source is one new module here (a builder decorated with `@register_source(...)`)
and its member in `service.specs.model.Source`; every module of this package is imported
below, so nothing else needs to know it. Registering a source twice is an error, as
torchvision refuses a model name registered twice.
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil
from collections.abc import Callable
from pathlib import Path

from torch import nn

from service.errors import Forbidden, ModelLoadError
from service.registry.paths import confine_kwargs
from service.specs.model import ModelSpec, Source

DEFAULT_WEIGHTS = "DEFAULT"

Builder = Callable[[ModelSpec, Path, bool], nn.Module]
"""(spec, model dir, pretrained) -> the module; raises ModelLoadError with a reason fit for INFO."""

_BUILDERS: dict[Source, Builder] = {}


def register_source(source: Source) -> Callable[[Builder], Builder]:
    """Class the decorated function as the builder of `source`."""

    def register(builder: Builder) -> Builder:
        if source in _BUILDERS:
            raise ValueError(f"source {source.value!r} is registered twice")
        _BUILDERS[source] = builder
        return builder

    return register


def registered_sources() -> dict[Source, Builder]:
    return dict(_BUILDERS)


def build_module(spec: ModelSpec, model_dir: Path, allow_downloads: bool) -> nn.Module:
    """Instantiate the architecture; pretrained weights only for "DEFAULT" with downloads on.

    Every path-like kwarg is resolved under the model dir first (`confine_kwargs`).
    """
    pretrained = spec.weights == DEFAULT_WEIGHTS
    if pretrained and not allow_downloads:
        raise ModelLoadError(
            'weights = "DEFAULT" needs downloads, which are disabled; set HOOKSERVE_ALLOW_DOWNLOADS=true '
            "or point weights at a local file under the model dir"
        )
    builder = _BUILDERS.get(spec.source)
    if builder is None:
        raise ModelLoadError(f"no builder is registered for source {spec.source.value!r}")
    try:  # timm's checkpoint_path and the like: files, so under the model dir like weights
        kwargs = confine_kwargs(model_dir, spec.kwargs)
    except Forbidden as exc:
        raise ModelLoadError(str(exc.detail)) from None
    return builder(spec.model_copy(update={"kwargs": kwargs}), model_dir, pretrained)


def closest(name: str, known: list[str]) -> list[str]:
    """Up to five known names like `name`, for error messages."""
    return difflib.get_close_matches(name, known, n=5, cutoff=0.5)


for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
