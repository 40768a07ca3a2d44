"""Integrated Gradients (Sundararajan et al. 2017, arXiv:1703.01365) from a zero baseline, through Captum."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from enum import StrEnum
from typing import Literal

import torch
from captum.attr import IntegratedGradients as CaptumIntegratedGradients
from pydantic import Field
from torch import Tensor, nn

from service.config import Settings
from service.errors import InvalidField
from service.introspection.attribution.base import (
    AttributionContext,
    AttributionMethod,
    Attributions,
    MethodParams,
    register_method,
)


class Baseline(StrEnum):
    zeros = "zeros"


class IntegratedGradientsParams(MethodParams):
    method: Literal["integrated_gradients"] = "integrated_gradients"
    steps: int = Field(50, ge=1, description="integrated_gradients: n_steps (limit max_ig_steps).")
    baseline: Baseline = Field(Baseline.zeros, description="integrated_gradients baseline.")


@register_method
class IntegratedGradients(AttributionMethod[IntegratedGradientsParams]):
    """Inputs go in chunks of the rows per forward (at most `ig_internal_batch_size`, fewer when the memory limit
    asks), which also bounds each internal forward, so no forward sees more examples than that. Requests with
    the same steps and baseline share a batch."""

    name = "integrated_gradients"
    params = IntegratedGradientsParams
    title = "Integrated Gradients (Sundararajan et al. 2017), with convergence deltas"
    chunked = True
    time_advice = "lower steps"

    def check_limits(self, params: IntegratedGradientsParams, settings: Settings) -> None:
        if params.steps > settings.max_ig_steps:
            raise InvalidField(f"steps {params.steps} is over the limit of {settings.max_ig_steps} (max_ig_steps)")

    def chunk(self, params: IntegratedGradientsParams, settings: Settings) -> int:
        return settings.ig_internal_batch_size

    def rows_per_input(self, params: IntegratedGradientsParams) -> int:
        return params.steps  # one input with 32 steps is 32 rows in one forward, not ig_internal_batch_size

    def lighter(
        self, params: IntegratedGradientsParams, shape: tuple[int, ...]
    ) -> tuple[IntegratedGradientsParams, str] | None:
        half = params.steps // 2
        return (params.model_copy(update={"steps": half}), f"steps {half}") if half >= 1 else None

    def rows_through(self, params: IntegratedGradientsParams, shape: tuple[int, ...]) -> tuple[int, int]:
        return params.steps + 2, params.steps  # the path's points, then the input and baseline for the delta

    def batch_key(self, params: IntegratedGradientsParams) -> Hashable:
        return params.steps, params.baseline

    def attribute(
        self,
        model: nn.Module,
        x: Tensor,
        targets: list[int],
        params: Sequence[IntegratedGradientsParams],
        ctx: AttributionContext,
    ) -> Attributions:
        batch = ctx.rows_per_forward(ctx.settings.ig_internal_batch_size)
        ig = CaptumIntegratedGradients(model)
        rows, deltas = [], []
        for start in range(0, x.shape[0], batch):
            chunk = x[start : start + batch].detach().requires_grad_(True)
            attr, delta = ig.attribute(
                chunk,
                baselines=0,
                target=targets[start : start + batch],
                n_steps=params[0].steps,  # equal within a batch (batch_key)
                internal_batch_size=batch,
                return_convergence_delta=True,
            )
            rows.append(attr)
            deltas.append(delta)
        return Attributions(torch.cat(rows), [float(d) for d in torch.cat(deltas).tolist()])
