"""Models shipped with the service: the seed docs' LeNet trained on scikit-learn's digits."""

from __future__ import annotations

from service.zoo.lenet import (
    LENET_INPUT_SIZE,
    LENET_MEAN,
    LENET_STD,
    LeNet,
    labels_path,
    lenet_preprocess_spec,
    load_lenet,
    samples_dir,
    weights_path,
)

__all__ = [
    "LENET_INPUT_SIZE",
    "LENET_MEAN",
    "LENET_STD",
    "LeNet",
    "labels_path",
    "lenet_preprocess_spec",
    "load_lenet",
    "samples_dir",
    "weights_path",
]
