"""`wide.py`: a 64-channel convolution whose feature maps make every capture large (soak and memory tests)."""

from __future__ import annotations

WIDE_PY = """
import torch
from torch import nn

class Wide(nn.Module):
    \"\"\"A 64-channel 3x3 convolution, ReLU, global mean, linear: its captures are 64 x the input's pixels.\"\"\"

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 64, 3, padding=1)
        self.relu = nn.ReLU()
        self.fc = nn.Linear(64, 4)

    def forward(self, x):
        return self.fc(self.relu(self.conv(x)).mean((2, 3)))
"""
