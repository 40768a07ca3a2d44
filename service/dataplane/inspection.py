"""Activations: what named layers take and give for these inputs, captured by hooks that live for one batch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from service.dataplane.base import PlaneBase
from service.dataplane.costs import ADVICE_ACTIVATIONS, activations_cost
from service.introspection.capture import Captured
from service.introspection.layers import resolve_layers
from service.introspection.predictions import top_k_predictions
from service.runtime.runners.activations import ACTIVATIONS, CaptureRequest, CaptureResult
from service.schemas.activations import ActivationsRequest


@dataclass(frozen=True)
class Activations:
    model: str
    predictions: list[dict[str, Any]] | None  # top-5 of the same forward, for class-score models
    captured: Captured


class Inspection(PlaneBase):
    async def activations(self, body: ActivationsRequest, images: Sequence[bytes] | None) -> Activations:
        """Layers are resolved before the inputs are decoded; the request joins a hooked batch of its model."""
        served = self.ready(body.model)
        model = served.model
        names = resolve_layers(model.layer_names, body.layers, self.settings.max_layers)
        request = CaptureRequest(tuple(names), body.capture, body.reduce)
        fmt = body.format.value
        found: CaptureResult
        _, found = await self.run_admitted(
            served,
            ACTIVATIONS,
            self.decode(body.inputs, images, model),
            request=request,
            estimate=lambda x, shapes: activations_cost(x, shapes, request, fmt),
            answer=(fmt, ADVICE_ACTIVATIONS),
        )
        output = found.output
        predictions = None
        if isinstance(output, torch.Tensor) and output.ndim == 2:
            predictions = top_k_predictions(output, 5, model.label, include_logits=False)
        return Activations(model.name, predictions, found.captured)
