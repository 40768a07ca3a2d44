"""The /gradients and /saliency jobs, run on the model's executor while it is held exclusively."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from service.config import Settings
from service.introspection.attribution import MethodParams, SaliencyItem, compute_saliency
from service.introspection.gradients import GradientResult, compute_gradients
from service.introspection.targets import TargetSpec, class_scores, resolve_targets
from service.registry.loaded import LoadedModel
from service.runtime.batching import foreign_shape_errors, forward_checked, to_device


def run_gradients(
    model: LoadedModel, inputs: torch.Tensor, layers: Sequence[str], target: TargetSpec, include_input: bool
) -> GradientResult:
    x = to_device(inputs, model)
    with foreign_shape_errors(model, x):
        result = compute_gradients(
            model.module, x, layers, target=target, labels=model.labels, include_input=include_input
        )
    result.gradients = {k: v.cpu() for k, v in result.gradients.items()}
    return result


def run_saliency(
    model: LoadedModel, inputs: torch.Tensor, params: MethodParams, target: TargetSpec, settings: Settings
) -> list[SaliencyItem]:
    x = to_device(inputs, model)
    with torch.inference_mode():
        logits = class_scores(forward_checked(model, x))
    targets = resolve_targets(target, logits, model.labels)
    items = compute_saliency(model.module, x, params, targets, settings=settings, logits=logits)
    return [
        SaliencyItem(i.target, i.score, i.probability, i.attribution.cpu(), i.heatmap.cpu(), i.convergence_delta)
        for i in items
    ]
