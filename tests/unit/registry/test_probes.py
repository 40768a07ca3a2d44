"""`same_outputs`: a prediction path is taken only when its outputs agree with the model's to 1e-4."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from service.registry.probes import Placement, same_outputs


def shifted(model: nn.Linear, by: float) -> nn.Linear:
    """A copy of `model` whose every output is off by `by` (a path that rounds or folds differently)."""
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.bias.add_(by)
    return other


@pytest.mark.parametrize(("by", "agrees"), [(0.0, True), (2e-5, True), (1e-3, False), (5e-3, False), (0.1, False)])
def test_a_path_agrees_only_when_its_outputs_are_within_1e_4(by: float, agrees: bool) -> None:
    torch.manual_seed(0)
    model = nn.Linear(8, 3).eval()
    x = Placement([8], torch.device("cpu"), torch.float32, False).probe(4)
    assert same_outputs(model, shifted(model, by), x) is agrees
