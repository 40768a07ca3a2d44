"""The shipped LeNet with one module per activation call, which Captum's DeepLift needs.

`LeNet` calls its one `relu` four times and its one `pool` twice; this subclass has the same
parameters (it loads the shipped weights) and gives every call its own module, so its class
scores equal LeNet's.
"""

from __future__ import annotations

import torch
from torch import nn

from service.zoo.lenet import LeNet, weights_path


class UnsharedLeNet(LeNet):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__(num_classes)
        self.relu1, self.relu2, self.relu3, self.relu4 = nn.ReLU(), nn.ReLU(), nn.ReLU(), nn.ReLU()
        self.pool1, self.pool2 = nn.MaxPool2d(2, 2), nn.MaxPool2d(2, 2)
        del self.relu, self.pool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool1(self.relu1(self.conv1(x)))
        x = self.pool2(self.relu2(self.conv2(x)))
        x = torch.flatten(x, 1)
        x = self.relu3(self.fc1(x))
        x = self.relu4(self.fc2(x))
        return self.fc3(x)  # type: ignore[no-any-return]


def unshared_lenet() -> UnsharedLeNet:
    """An UnsharedLeNet with the shipped digits weights, in eval mode."""
    model = UnsharedLeNet()
    model.load_state_dict(torch.load(weights_path(), weights_only=True)["model_state_dict"])
    return model.eval()
