"""Captum's `NoiseTunnel` drawing its noise from a generator of its own, never from torch's global one.

SmoothGrad and GradientSHAP promise that the same `seed` gives the same map. Seeding torch's global
generator for that (and restoring it afterwards) is not safe in a server: every lane thread and every
model being built shares that generator, so two seeded requests on two lanes interleave their draws,
and the restore rewinds whatever another thread drew meanwhile. A `torch.Generator` per attribution
draws the same numbers as the global generator seeded with the same value, and touches nothing else.
"""

from __future__ import annotations

import torch
from captum.attr import Attribution, NoiseTunnel
from torch import Tensor

if not callable(getattr(NoiseTunnel, "_add_noise_to_input", None)):  # captum < 0.8 drew its noise in a closure
    raise ImportError("seeded SmoothGrad and GradientSHAP need captum >= 0.8 (NoiseTunnel._add_noise_to_input)")


class SeededNoiseTunnel(NoiseTunnel):  # type: ignore[misc]  # captum is untyped
    """`NoiseTunnel(method)` whose Gaussian noise comes from `torch.Generator(device).manual_seed(seed)`."""

    def __init__(self, attribution_method: Attribution, seed: int, device: torch.device) -> None:
        super().__init__(attribution_method)
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def _add_noise_to_input(self, input: Tensor, stdev: float, nt_samples_partition: int) -> Tensor:
        """As Captum's: `nt_samples_partition` noisy copies of each row, the noise N(0, stdev²) in float32."""
        size = (input.shape[0] * nt_samples_partition, *input.shape[1:])
        spread = torch.full(size, stdev, dtype=torch.float32, device=input.device)
        noise = torch.normal(0.0, spread, generator=self.generator)
        return input.repeat_interleave(nt_samples_partition, dim=0) + noise
