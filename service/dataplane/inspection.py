"""Activations: what named layers take and give for these inputs, captured by hooks that live for one batch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from service.dataplane.base import PlaneBase
from service.dataplane.costs import ADVICE_ACTIVATIONS, activations_cost
from service.dataplane.nodes import node_graph
from service.errors import InvalidField
from service.introspection.capture import Captured
from service.introspection.layers import resolve_layers
from service.introspection.nodes import node_bytes, resolve_nodes
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
        """Layers and nodes are resolved before the inputs are decoded; the request joins a hooked batch."""
        served = self.ready(body.model)
        model = served.model
        limit = self.settings.max_layers
        names = resolve_layers(model.layer_names, body.layers, limit) if body.layers else []
        if len(body.nodes) > limit:  # before a first request's trace
            raise InvalidField(f"nodes: {len(body.nodes)} names given, more than the limit of {limit} (max_layers)")
        graph = await node_graph(served) if body.nodes else None
        nodes = resolve_nodes(graph, body.nodes, limit) if graph is not None else []
        _check_sites(names, nodes, limit)
        request = CaptureRequest(tuple(names), body.capture, body.reduce, tuple(nodes))
        fmt = body.format.value
        extra = node_bytes(graph, nodes) if graph is not None else 0
        found: CaptureResult
        _, found = await self.run_admitted(
            served,
            ACTIVATIONS,
            self.decode(body.inputs, images, model),
            request=request,
            estimate=lambda x, shapes: activations_cost(x, shapes, request, fmt, extra),
            answer=(fmt, ADVICE_ACTIVATIONS),
        )
        output = found.output
        predictions = None
        if isinstance(output, torch.Tensor) and output.ndim == 2:
            predictions = top_k_predictions(output, 5, model.label, include_logits=False)
        return Activations(model.name, predictions, found.captured)


def _check_sites(layers: Sequence[str], nodes: Sequence[str], limit: int) -> None:
    """Layers and nodes count together against max_layers; a name in both would key two captures alike."""
    if len(layers) + len(nodes) > limit:
        raise InvalidField(
            f"{len(layers)} layers and {len(nodes)} nodes, more than the limit of {limit} (max_layers) together; "
            "name fewer or use narrower patterns"
        )
    both = sorted(set(layers) & set(nodes))
    if both:
        raise InvalidField(
            f"{', '.join(repr(n) for n in both)}: named both as a layer and as a node; name each in one of them"
        )
