"""GradientSHAP (Lundberg & Lee 2017, arXiv:1705.07874), as Captum's `GradientShap` computes it, seeded per input.

Expected gradients: for each sample, a baseline drawn from the given constant baselines, a random
point between it and the (optionally noised) input, and (input - baseline) × the gradient there;
the attribution is their mean.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Annotated, Literal

import numpy as np
import torch
from captum.attr._core.gradient_shap import InputBaselineXGradient
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

Constant = Annotated[float, Field(ge=-1e6, le=1e6, allow_inf_nan=False)]


class GradientShapParams(MethodParams):
    method: Literal["gradient_shap"] = "gradient_shap"
    samples: int = Field(16, ge=1, description="gradient_shap: n_samples (limit max_gradient_shap_samples).")
    baselines: list[Constant] = Field(
        [0.0],
        min_length=1,
        max_length=16,
        description="gradient_shap: the baseline distribution: constant inputs of these values, drawn uniformly.",
    )
    noise: float = Field(
        0.0, ge=0.0, le=10.0, description="gradient_shap: stdev of the input noise, a fraction of x.max() - x.min()."
    )
    seed: int = Field(0, ge=0, le=2**32 - 1, description="gradient_shap: the same seed gives the same map.")


# Captum draws baselines and path points from NumPy's global generator, which every thread shares: one seeded
# attribution at a time (those of other models wait here). Its input noise comes from a generator of its own.
_NUMPY_RNG = threading.Lock()


@contextmanager
def numpy_seeded(seed: int) -> Iterator[None]:
    """NumPy's global generator seeded with `seed` inside the block (one block at a time), restored afterwards."""
    with _NUMPY_RNG:
        state = np.random.get_state()
        np.random.seed(seed)
        try:
            yield
        finally:
            np.random.set_state(state)


@register_method
class GradientShap(AttributionMethod[GradientShapParams]):
    """Each input runs alone through Captum's GradientSHAP (a `NoiseTunnel` over `InputBaselineXGradient`, built
    here so that its noise generator is the input's own), with NumPy's generator seeded with its `seed`, so its
    map does not depend on the rest of the batch, and requests with different parameters share a batch.
    All `samples` of one input go through the model in one forward and one backward."""

    name = "gradient_shap"
    params = GradientShapParams
    title = "GradientSHAP (Lundberg & Lee 2017): expected gradients from constant baselines, seeded"
    time_advice = "lower samples"

    def chunk(self, params: GradientShapParams, settings: Settings) -> int:
        return params.samples

    def lighter(self, params: GradientShapParams, shape: tuple[int, ...]) -> tuple[GradientShapParams, str] | None:
        return halved(params, "samples")

    def rows_through(self, params: GradientShapParams, shape: tuple[int, ...]) -> tuple[int, int]:
        return params.samples, params.samples

    def check_limits(self, params: GradientShapParams, settings: Settings) -> None:
        if params.samples > settings.max_gradient_shap_samples:
            raise InvalidField(
                f"samples {params.samples} is over the limit of {settings.max_gradient_shap_samples} "
                "(max_gradient_shap_samples)"
            )

    def attribute(
        self,
        model: nn.Module,
        x: Tensor,
        targets: list[int],
        params: Sequence[GradientShapParams],
        ctx: AttributionContext,
    ) -> Attributions:
        expected_gradients = InputBaselineXGradient(same_dtype(model, x.dtype), multiply_by_inputs=True)
        rows = []
        for i, (target, own) in enumerate(zip(targets, params, strict=True)):
            row = x[i : i + 1].detach()
            stdev = float(own.noise * (row.max() - row.min()))
            baselines = torch.stack([torch.full_like(row[0], value) for value in own.baselines])
            row.requires_grad_(True)
            tunnel = SeededNoiseTunnel(expected_gradients, own.seed, row.device)
            with numpy_seeded(own.seed):
                rows.append(
                    tunnel.attribute(
                        row,
                        nt_type="smoothgrad",
                        nt_samples=own.samples,
                        stdevs=stdev,
                        draw_baseline_from_distrib=True,
                        baselines=(baselines,),
                        target=target,
                    )
                )
        return Attributions(torch.cat(rows))
