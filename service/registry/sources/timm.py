"""timm's model registry (`timm.create_model`), `features_only` and the other kwargs included."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from service.errors import ModelLoadError
from service.registry.sources import closest, register_source
from service.specs.model import ModelSpec, Source


@register_source(Source.timm)
def build(spec: ModelSpec, model_dir: Path, pretrained: bool) -> nn.Module:
    import timm

    if not timm.is_model(spec.architecture):
        raise ModelLoadError(
            f"timm has no model {spec.architecture!r}; closest: {closest(spec.architecture, timm.list_models())}"
        )
    module: nn.Module = timm.create_model(spec.architecture, pretrained=pretrained, **spec.kwargs)
    return module
