"""Reference models whose weights do not depend on what other threads draw from torch's global generator.

A test process also runs servers, whose loader and lane threads may draw from the global generator at
any moment (building a torchvision model draws its initial weights there), so `torch.manual_seed(0)`
followed by `resnet18()` in a test can give different weights from one run to the next. Several parity
tests against Captum hold for the weights of a clean `manual_seed(0)` only: on a randomly initialised
resnet18, a few gradient elements of other weights sit on ReLU kinks that the thread count flips.
"""

from __future__ import annotations

import functools
import io
import json
import subprocess
import sys
from typing import Any

import torch
from torchvision.models import ResNet, resnet18

_BUILD = """
import io, json, sys
import torch
from torchvision.models import resnet18
seed, kwargs = json.loads(sys.argv[1])
torch.manual_seed(seed)
buffer = io.BytesIO()
torch.save(resnet18(weights=None, **kwargs).state_dict(), buffer)
sys.stdout.buffer.write(buffer.getvalue())
"""


@functools.cache
def _resnet18_state(seed: int, kwargs_json: str) -> bytes:
    """The state dict of `manual_seed(seed); resnet18(**kwargs)`, built in a process of its own."""
    argument = json.dumps([seed, json.loads(kwargs_json)])
    return subprocess.run([sys.executable, "-c", _BUILD, argument], capture_output=True, check=True).stdout


def seeded_resnet18(seed: int = 0, **kwargs: Any) -> ResNet:
    """torchvision's resnet18 in eval mode, with the weights `torch.manual_seed(seed)` gives it in a quiet process."""
    model = resnet18(weights=None, **kwargs)
    state = torch.load(io.BytesIO(_resnet18_state(seed, json.dumps(kwargs, sort_keys=True))), weights_only=True)
    model.load_state_dict(state)
    return model.eval()
