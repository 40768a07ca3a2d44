"""Reference models the API tests compare the server's answers with."""

from __future__ import annotations

import pytest
import torch
from torchvision.models import ResNet

from service.zoo.lenet import LeNet, weights_path
from tests.helpers.reference_models import seeded_resnet18


@pytest.fixture(scope="module")
def r18() -> ResNet:
    """A seeded resnet18; tests save its weights for the server to load."""
    return seeded_resnet18()


@pytest.fixture(scope="module")
def lenet() -> LeNet:
    """The shipped digits LeNet, as the server loads it."""
    model = LeNet()
    model.load_state_dict(torch.load(weights_path(), weights_only=True)["model_state_dict"])
    return model.eval()
