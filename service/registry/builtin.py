"""The built-in registry, served when no models config is given."""

from __future__ import annotations

from pathlib import Path

from service.specs.model import ModelSpec, OptimizerSpec, Source
from service.zoo.lenet import LENET_INPUT_SIZE, labels_path, lenet_preprocess_spec, weights_path

ZOO_DIR = Path(weights_path()).parent.parent


def builtin_specs() -> list[ModelSpec]:
    """lenet (trained on digits, shipped weights), resnet18 and efficientvit_b0 (random weights)."""
    zoo = ZOO_DIR
    return [
        ModelSpec(
            name="lenet",
            source=Source.python,
            architecture="service.zoo.lenet:LeNet",
            weights=str(weights_path().relative_to(zoo)),
            labels=str(labels_path().relative_to(zoo)),
            input_size=list(LENET_INPUT_SIZE),
            preprocess=lenet_preprocess_spec(),
            optimizer=OptimizerSpec.model_validate({"type": "SGD", "lr": 0.001, "momentum": 0.9}),
            max_batch_delay_ms=1.0,
        ),
        ModelSpec(name="resnet18", source=Source.torchvision, architecture="resnet18"),
        ModelSpec(
            name="efficientvit_b0",
            source=Source.timm,
            architecture="efficientvit_b0",
            kwargs={"features_only": True},
        ),
    ]
