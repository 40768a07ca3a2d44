"""Probe batches for checking a prediction path against the model: where it runs, and when outputs agree."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

TOLERANCE = 1e-4  # the most a prediction path's outputs may differ from the model's (rtol and atol)


@dataclass(frozen=True)
class Placement:
    """Where and how the model runs: a probe batch is built to match."""

    input_size: list[int]
    device: torch.device
    dtype: torch.dtype
    nhwc: bool  # channels_last

    def probe(self, batch: int) -> torch.Tensor:
        """A seeded random batch of the model's input size, dtype, device and memory format."""
        x = torch.randn((batch, *self.input_size), generator=torch.Generator().manual_seed(0))
        x = x.to(device=self.device, dtype=self.dtype)
        return x.contiguous(memory_format=torch.channels_last) if self.nhwc and x.ndim == 4 else x


def same_outputs(module: nn.Module, other: nn.Module, x: torch.Tensor) -> bool:
    """Whether `other(x)` has `module(x)`'s structure of tensors, each within `TOLERANCE`."""
    with torch.inference_mode():
        want, got = output_tensors(module(x)), output_tensors(other(x))
    return len(want) == len(got) and all(
        w.shape == g.shape and torch.allclose(g.float(), w.float(), rtol=TOLERANCE, atol=TOLERANCE)
        for w, g in zip(want, got, strict=True)
    )


def output_tensors(output: object) -> list[torch.Tensor]:
    """The tensors of a forward's output, in order (nested dicts, lists and tuples flattened)."""
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, dict):
        return [t for v in output.values() for t in output_tensors(v)]
    if isinstance(output, (list, tuple)):
        return [t for v in output for t in output_tensors(v)]
    return []
