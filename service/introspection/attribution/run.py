"""Run a registered attribution method over a batch (one or several requests): targets, scores, rows, heatmaps."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from service.config import Settings
from service.introspection.attribution.base import (
    INPUT,
    AttributionContext,
    AttributionMethod,
    MethodParams,
    SaliencyItem,
    check,
    method_named,
)
from service.introspection.gradients import INPUT_KEY, layer_gradients
from service.introspection.targets import class_scores, target_scores
from service.introspection.tokens import TokenLayout, is_token_row, patch_grid, row_grid, token_layout


def attribute_batch(
    model: nn.Module,
    x: Tensor,
    params: Sequence[MethodParams],
    resolve: Callable[[Tensor], list[int]],
    settings: Settings,
    *,
    rows_per_forward: int | None = None,
    plain: nn.Module | None = None,
) -> list[SaliencyItem]:
    """One item per row of `x`, with `params[i]` (one method; batch-key-equal) and the targets `resolve(logits)` picks;
    `rows_per_forward`: the most rows one of the method's own forwards may see (None: its setting); `plain`: a copy
    of `model` that agrees with it within its checked tolerance and runs faster without hooks or autograd (the
    prediction path's), for the forwards of methods that need neither (`plain_forwards`: occlusion, ablation).

    The model is never mutated; autograd runs on a detached copy of `x`, or only downstream of
    the layer a method differentiates at.
    """
    method: AttributionMethod[Any] = method_named(params[0].method)
    n = x.shape[0]
    check(len(params) == n, f"{len(params)} parameter sets for {n} inputs")
    check(x.is_floating_point(), f"saliency needs a floating-point input, got {x.dtype}")

    def checked(logits: Tensor) -> list[int]:
        targets = [int(t) for t in resolve(logits)]
        check(len(targets) == n, f"{len(targets)} targets for {n} inputs")
        k = logits.shape[1]
        for t in targets:
            check(0 <= t < k, f"target index {t} is out of range: the model has {k} classes [0, {k - 1}]")
        return targets

    deltas: list[Any] = [None] * n
    layout = token_layout(model, tuple(x.shape[1:]))
    on_grid = method.over_tokens
    with torch.inference_mode(False):
        source = method.graph_from(params[0], model)
        if source is not None:
            found = layer_gradients(
                model, x, [] if source == INPUT else [source], checked, include_input=source == INPUT
            )
            keys = [INPUT_KEY] if source == INPUT else found.keys[source]
            kept = [found.kept[key] for key in keys]
            grads = [found.gradients[key] for key in keys]
            if source != INPUT and _token_outputs(kept, layout):
                assert layout is not None
                kept, grads = [patch_grid(t, layout) for t in kept], [patch_grid(g, layout) for g in grads]
                on_grid = True
            rows = method.from_graph(kept, grads, params[0], x).detach()
            logits, targets = found.logits, found.targets
        else:
            runs = plain if plain is not None and method.plain_forwards else model
            with torch.no_grad():
                logits = class_scores(runs(x))
            targets = checked(logits)
            with torch.enable_grad():
                inputs = x.detach().clone().requires_grad_(True)
                ctx = AttributionContext(settings, logits, rows_per_forward)
                attributions = method.attribute(runs, inputs, targets, params, ctx)
            rows = attributions.rows.detach()
            deltas = list(attributions.deltas) if attributions.deltas is not None else deltas
            on_grid = on_grid or attributions.tokens is not None
    scores = target_scores(logits, targets).float().tolist()
    probabilities = target_scores(logits.float().softmax(dim=1), targets).tolist()
    items = []
    for i in range(n):
        row = rows[i]
        tokens = on_grid or (x.dim() == 4 and is_token_row(row, layout))
        drawn = row_grid(row, layout) if tokens and not on_grid and layout is not None else row
        heatmap = _minmax(method.heatmap(drawn, x))
        attribution = method.attribution_row(row)
        items.append(
            SaliencyItem(
                targets[i], scores[i], probabilities[i], attribution, heatmap, deltas[i], layout if tokens else None
            )
        )
    return items


def _token_outputs(kept: Sequence[Tensor], layout: TokenLayout | None) -> bool:
    """Whether a layer gave one token sequence `[N, T, D]` of the inputs' layout (Grad-CAM reads it as a grid)."""
    return layout is not None and len(kept) == 1 and kept[0].dim() == 3 and layout.holds(int(kept[0].shape[1]))


def compute_saliency(
    model: nn.Module,
    x: Tensor,
    params: MethodParams,
    targets: Sequence[int],
    *,
    settings: Settings,
    plain: nn.Module | None = None,
) -> list[SaliencyItem]:
    """Attribute `targets[i]` for each input row `x[i]` with one request's `params` (`plain`: as attribute_batch's)."""
    check(len(targets) == x.shape[0], f"{len(targets)} targets for {x.shape[0]} inputs")
    method_named(params.method).check_input(params, tuple(x.shape[1:]), settings)
    return attribute_batch(model, x, [params] * x.shape[0], lambda logits: list(targets), settings, plain=plain)


def _minmax(heatmap: Tensor) -> Tensor:
    """Min-max scale to [0, 1] (non-finite values count as 0); all zeros when flat."""
    h = torch.nan_to_num(heatmap.detach().float(), nan=0.0, posinf=0.0, neginf=0.0)
    low, high = h.min(), h.max()
    if not bool(high > low):
        return torch.zeros_like(h)
    return ((h - low) / (high - low)).clamp_(0.0, 1.0)
