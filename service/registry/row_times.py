"""How long one input row takes through a model: a forward, and a forward with its backward, measured at load.

Measured on one row of the model's input size on its own device (a few runs, the fastest kept, so
a busy moment does not inflate it), with as many threads as the process uses then. Request time
estimates (`service.dataplane.timing`) multiply these by the rows a request will push through.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from service.registry.probes import output_tensors

RUNS = 3


@dataclass(frozen=True)
class RowTimes:
    """Seconds per input row: `forward` without autograd, `backward` what a forward with autograd and its
    backward add over it; `device` and `threads` they were measured with."""

    forward: float = 0.0
    backward: float = 0.0
    device: str = "cpu"
    threads: int = 1

    @property
    def measured(self) -> bool:
        return self.forward > 0.0


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _fastest(run: Callable[[], None], device: torch.device, runs: int) -> float:
    best = float("inf")
    for _ in range(runs):
        _synchronize(device)
        start = time.perf_counter()
        run()
        _synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best


def measure_row_times(module: nn.Module, row: torch.Tensor, runs: int = RUNS) -> RowTimes:
    """`module`'s times on `row` (a batch of one), after one untimed run of each (caches, lazy inits)."""
    device = row.device

    def forward() -> None:
        with torch.no_grad():
            module(row)

    def forward_backward() -> None:
        with torch.enable_grad():
            x = row.detach().clone().requires_grad_(True)
            found = [t for t in output_tensors(module(x)) if t.requires_grad]
            if found:  # the gradient of the input only: the parameters' .grad stay as they are
                torch.autograd.grad(found[0].float().sum(), x, allow_unused=True)

    with torch.inference_mode(False):
        forward()
        fwd = _fastest(forward, device, runs)
        both = 2 * fwd  # a backward about as long as its forward, where it cannot be measured
        if row.is_floating_point():
            try:
                forward_backward()
                both = _fastest(forward_backward, device, runs)
            except RuntimeError:  # a model autograd cannot go through: gradient methods will say so themselves
                pass
    return RowTimes(fwd, max(0.0, both - fwd), str(device), torch.get_num_threads())
