"""The built-in registry, served when no models config is given."""

from __future__ import annotations

from pathlib import Path

from service.specs.model import ModelSpec, OptimizerSpec, Source
from service.zoo.lenet import LENET_INPUT_SIZE, labels_path, lenet_preprocess_spec, weights_path
from service.zoo.vit import VIT_INPUT_SIZE, vit_weights_path

ZOO_DIR = Path(weights_path()).parent.parent


def builtin_specs() -> list[ModelSpec]:
    """lenet and vit_digits (trained on digits, shipped weights); resnet18, efficientvit_b0 and vit_tiny (random
    weights: real sizes and speeds)."""
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
        ModelSpec(
            name="vit_digits",
            source=Source.python,
            architecture="service.zoo.vit:DigitsViT",
            weights=str(vit_weights_path().relative_to(zoo)),
            labels=str(labels_path().relative_to(zoo)),
            input_size=list(VIT_INPUT_SIZE),
            preprocess=lenet_preprocess_spec(),
            max_batch_delay_ms=1.0,
        ),
        ModelSpec(
            name="vit_tiny",
            source=Source.timm,
            architecture="vit_tiny_patch16_224",
            kwargs={"dynamic_img_size": True},  # any multiple of 16 px: its position embedding is resampled
        ),
    ]
