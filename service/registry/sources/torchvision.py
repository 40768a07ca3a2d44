"""torchvision's model builders (`torchvision.models.get_model`)."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from service.errors import ModelLoadError
from service.registry.sources import closest, register_source
from service.specs.model import ModelSpec, Source


@register_source(Source.torchvision)
def build(spec: ModelSpec, model_dir: Path, pretrained: bool) -> nn.Module:
    import torchvision

    known = torchvision.models.list_models()
    if spec.architecture not in known:
        raise ModelLoadError(
            f"torchvision has no model {spec.architecture!r}; closest: {closest(spec.architecture, known)}"
        )
    weights = "DEFAULT" if pretrained else None
    module: nn.Module = torchvision.models.get_model(spec.architecture, weights=weights, **spec.kwargs)
    return module
