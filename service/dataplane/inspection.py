"""Activations: what named layers take and give for these inputs, captured by hooks that live for one request."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from service.dataplane.base import PlaneBase
from service.introspection.capture import Captured
from service.introspection.layers import resolve_layers
from service.runtime.activations_job import run_activations
from service.schemas.activations import ActivationsRequest


@dataclass(frozen=True)
class Activations:
    model: str
    predictions: list[dict[str, Any]] | None  # top-5 of the same forward, for class-score models
    captured: Captured


class Inspection(PlaneBase):
    async def activations(self, body: ActivationsRequest, images: Sequence[bytes] | None) -> Activations:
        served = self.ready(body.model)
        model = served.model
        inputs = await self.decode(body.inputs, images, model)
        names = resolve_layers(model.layer_names, body.layers, self.settings.max_layers)
        result = await served.executor.run_exclusive(
            lambda: run_activations(model, inputs, names, body.capture, body.reduce)
        )
        return Activations(model.name, result.predictions, result.captured)
