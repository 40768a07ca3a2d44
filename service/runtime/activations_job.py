"""The /activations job: one forward with request-scoped hooks, run on the model's executor."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from service.introspection.capture import Captured, capture_activations
from service.introspection.predictions import top_k_predictions
from service.introspection.tensor_stats import reduce_tensor
from service.registry.loaded import LoadedModel
from service.runtime.batching import forward_checked, to_device
from service.specs.vocab import Capture, Reduce


@dataclass
class ActivationsResult:
    captured: Captured
    predictions: list[dict[str, Any]] | None


def run_activations(
    model: LoadedModel, inputs: torch.Tensor, layers: Sequence[str], capture: Capture, reduce: Reduce | None
) -> ActivationsResult:
    """Forward `inputs` with hooks on `layers` (removed before returning, even on failure)."""
    x = to_device(inputs, model)

    def forward() -> Any:
        with torch.inference_mode():
            return forward_checked(model, x)  # a sample shape the model cannot run is a 422, as in /predict

    output, captured = capture_activations(model.module, layers, capture, forward)
    if reduce is not None:
        captured = {
            key: {side: reduce_tensor(t, reduce) for side, t in sides.items()} for key, sides in captured.items()
        }
    predictions = None
    if isinstance(output, torch.Tensor) and output.ndim == 2:
        predictions = top_k_predictions(output.detach().cpu(), 5, model.label, include_logits=False)
    return ActivationsResult(captured, predictions)
