"""SmoothGrad (Smilkov et al. 2017, arXiv:1706.03825): Captum's `NoiseTunnel` over `Saliency`, seeded per input."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from captum.attr import Saliency
from pydantic import Field
from torch import Tensor, nn

from service.config import Settings
from service.errors import InvalidField
from service.introspection.attribution.base import (
    AttributionContext,
    AttributionMethod,
    Attributions,
    MethodParams,
    halved,
    register_method,
    same_dtype,
)
from service.introspection.attribution.noise_tunnel import SeededNoiseTunnel


class SmoothGradParams(MethodParams):
    method: Literal["smoothgrad"] = "smoothgrad"
    samples: int = Field(25, ge=1, description="smoothgrad: nt_samples (limit max_smoothgrad_samples).")
    noise: float = Field(0.15, ge=0.0, le=10.0, description="smoothgrad: stdev as a fraction of x.max() - x.min().")
    seed: int = Field(0, ge=0, le=2**63 - 1, description="smoothgrad: the same seed gives the same map.")


@register_method
class SmoothGrad(AttributionMethod[SmoothGradParams]):
    """Each input gets its own noise level `noise * (x.max() - x.min())` and noise from a generator seeded with its
    own `seed`, so an input's map does not depend on the rest of the batch, and requests with different
    samples, noise and seeds share one batch. Noisy copies go through the model in chunks of the rows per
    forward (at most `smoothgrad_batch_size`, fewer when the memory limit asks)."""

    name = "smoothgrad"
    params = SmoothGradParams
    title = "SmoothGrad (Smilkov et al. 2017): the gradient averaged over noisy copies, seeded"
    chunked = True
    time_advice = "lower samples"

    def check_limits(self, params: SmoothGradParams, settings: Settings) -> None:
        if params.samples > settings.max_smoothgrad_samples:
            raise InvalidField(
                f"samples {params.samples} is over the limit of {settings.max_smoothgrad_samples} "
                "(max_smoothgrad_samples)"
            )

    def chunk(self, params: SmoothGradParams, settings: Settings) -> int:
        return min(params.samples, settings.smoothgrad_batch_size)

    def rows_per_input(self, params: SmoothGradParams) -> int:
        return params.samples

    def lighter(self, params: SmoothGradParams, shape: tuple[int, ...]) -> tuple[SmoothGradParams, str] | None:
        return halved(params, "samples")

    def rows_through(self, params: SmoothGradParams, shape: tuple[int, ...]) -> tuple[int, int]:
        return params.samples, params.samples

    def attribute(
        self,
        model: nn.Module,
        x: Tensor,
        targets: list[int],
        params: Sequence[SmoothGradParams],
        ctx: AttributionContext,
    ) -> Attributions:
        saliency = Saliency(same_dtype(model, x.dtype))
        rows = []
        for i, (target, own) in enumerate(zip(targets, params, strict=True)):
            row = x[i : i + 1].detach()
            stdev = float(own.noise * (row.max() - row.min()))
            row.requires_grad_(True)
            tunnel = SeededNoiseTunnel(saliency, own.seed, row.device)
            rows.append(
                tunnel.attribute(
                    row,
                    nt_type="smoothgrad",
                    nt_samples=own.samples,
                    nt_samples_batch_size=ctx.rows_per_forward(ctx.settings.smoothgrad_batch_size),
                    stdevs=stdev,
                    target=target,
                )
            )
        return Attributions(torch.cat(rows))
