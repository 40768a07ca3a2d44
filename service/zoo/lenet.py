"""The seed docs' LeNet (the PyTorch 60-minute-blitz CIFAR net), shipped trained on scikit-learn's digits.

LeCun et al., "Gradient-based learning applied to document recognition", Proc. IEEE 86(11), 1998.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from service.specs.model import Interpolation, PreprocessSpec

LENET_INPUT_SIZE: list[int] = [3, 32, 32]
# Per-channel statistics of the 1437 training digits after `lenet_preprocess_spec()` scaling to [0, 1].
LENET_MEAN: list[float] = [0.3065, 0.3065, 0.3065]
LENET_STD: list[float] = [0.3235, 0.3235, 0.3235]
LENET_NUM_CLASSES = 10

_HERE = Path(__file__).resolve().parent


class LeNet(nn.Module):
    """conv-pool-conv-pool-fc-fc-fc on 3×32×32; one shared `pool` and one shared `relu` module.

    The shared `relu` runs four times per forward, so per-call activations are `relu`, `relu#2`, ...
    """

    def __init__(self, num_classes: int = LENET_NUM_CLASSES) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.relu(self.conv1(x)))
        x = self.pool(self.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        x = self.relu(self.fc1(x))
        x = self.relu(self.fc2(x))
        return self.fc3(x)  # type: ignore[no-any-return]


def lenet_preprocess_spec() -> PreprocessSpec:
    """Serving and training preprocessing: grayscale, upscale the 8×8 digit to 32×32, normalize."""
    return PreprocessSpec(
        resize=32,
        crop=32,
        interpolation=Interpolation.bilinear,
        mean=list(LENET_MEAN),
        std=list(LENET_STD),
        grayscale=True,
    )


def weights_path() -> Path:
    """The shipped training checkpoint (model + SGD state), see `service.zoo.train_lenet`."""
    return _HERE / "weights" / "lenet_digits.pt"


def labels_path() -> Path:
    """The class names file: lines "0".."9"."""
    return _HERE / "digits_labels.txt"


def samples_dir() -> Path:
    """Folder of `digit_<label>.png` samples (8×8 grayscale, from the held-out digits)."""
    return _HERE / "samples"


def load_lenet(path: Path | None = None) -> LeNet:
    """A LeNet in eval mode with the weights of a training checkpoint (default: the shipped one)."""
    checkpoint = torch.load(path or weights_path(), map_location="cpu", weights_only=True)
    model = LeNet()
    model.load_state_dict(checkpoint["model_state_dict"])
    return model.eval()
