"""Times per row measured at load: positive, and a model autograd cannot go through still loads."""

from __future__ import annotations

import torch
from torch import nn

from service.registry.row_times import measure_row_times


def test_a_forward_and_backward_are_measured_without_touching_the_parameters() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.LazyLinear(2)).eval()
    row = torch.rand(1, 3, 8, 8)
    model(row)
    times = measure_row_times(model, row, runs=1)
    assert times.forward > 0
    assert times.backward >= 0
    assert times.measured
    assert all(p.grad is None for p in model.parameters())


def test_a_backward_that_fails_leaves_an_estimate() -> None:
    class Failing(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if torch.is_grad_enabled():
                raise RuntimeError("no autograd here")
            return x.sum(dim=(1, 2, 3))

    row = torch.rand(1, 3, 8, 8)
    times = measure_row_times(Failing(), row, runs=1)
    assert times.forward > 0
    assert times.backward == times.forward
