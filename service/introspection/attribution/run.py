"""Run a registered attribution method over a batch: targets, scores, rows, heatmaps."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from service.config import Settings
from service.introspection.attribution.base import (
    AttributionContext,
    MethodParams,
    SaliencyItem,
    check,
    method_named,
)
from service.introspection.targets import class_scores, target_scores


def compute_saliency(
    model: nn.Module,
    x: Tensor,
    params: MethodParams,
    targets: Sequence[int],
    *,
    settings: Settings,
    logits: Tensor | None = None,
) -> list[SaliencyItem]:
    """Attribute `targets[i]` for each input row `x[i]` with `params.method`; one item per input.

    `logits`: the model's output for `x` when the caller already has it (saves a forward).
    The model is never mutated; autograd runs on a detached, grad-requiring copy of `x`.
    """
    method = method_named(params.method)
    n = x.shape[0]
    check(len(targets) == n, f"{len(targets)} targets for {n} inputs")
    check(x.is_floating_point(), f"saliency needs a floating-point input, got {x.dtype}")
    with torch.inference_mode(False), torch.enable_grad():
        inputs = x.detach().clone().requires_grad_(True)
        if logits is None:
            with torch.no_grad():
                logits = model(inputs)
        logits = class_scores(logits)
        k = logits.shape[1]
        for t in targets:
            check(0 <= t < k, f"target index {t} is out of range: the model has {k} classes [0, {k - 1}]")
        scores = target_scores(logits, targets).float().tolist()
        probabilities = target_scores(logits.float().softmax(dim=1), targets).tolist()
        target_list = [int(t) for t in targets]
        found = method.attribute(model, inputs, target_list, params, AttributionContext(settings, logits))
    deltas: list[Any] = found.deltas if found.deltas is not None else [None] * n
    items = []
    for i in range(n):
        row = found.rows[i].detach()
        heatmap = _minmax(method.heatmap(row, x))
        items.append(
            SaliencyItem(target_list[i], scores[i], probabilities[i], method.attribution_row(row), heatmap, deltas[i])
        )
    return items


def _minmax(heatmap: Tensor) -> Tensor:
    """Min-max scale to [0, 1] (non-finite values count as 0); all zeros when flat."""
    h = torch.nan_to_num(heatmap.detach().float(), nan=0.0, posinf=0.0, neginf=0.0)
    low, high = h.min(), h.max()
    if not bool(high > low):
        return torch.zeros_like(h)
    return ((h - low) / (high - low)).clamp_(0.0, 1.0)
