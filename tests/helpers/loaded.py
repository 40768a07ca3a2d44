"""A `LoadedModel` around any module, as the loader would build it, for runtime and codec tests."""

from __future__ import annotations

import torch
from torch import nn

from service.introspection.layers import module_names
from service.registry.loaded import LoadedModel
from service.specs.model import ModelSpec, PreprocessSpec


def loaded_model(
    module: nn.Module,
    input_size: list[int],
    *,
    name: str = "toy",
    labels: list[str] | None = None,
    num_classes: int | None = None,
    preprocess: PreprocessSpec | None = None,
) -> LoadedModel:
    """`module` in eval mode on the CPU, float32, with random weights as far as INFO goes."""
    module = module.eval()
    params = list(module.parameters())
    return LoadedModel(
        spec=ModelSpec.model_validate(
            {"name": name, "source": "python", "architecture": f"tests:{type(module).__name__}"}
        ),
        module=module,
        device=torch.device("cpu"),
        dtype=torch.float32,
        preprocess=preprocess or PreprocessSpec(),
        input_size=input_size,
        labels=labels,
        optimizer=None,
        weights="random",
        num_classes=num_classes,
        num_parameters=sum(p.numel() for p in params),
        trainable_parameters=sum(p.numel() for p in params if p.requires_grad),
        text=repr(module),
        layer_names=tuple(module_names(module)),
    )
