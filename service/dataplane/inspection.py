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
from service.introspection.tokens import TokenLayout, selected_tokens, token_layout
from service.registry.loaded import LoadedModel
from service.runtime.runners.activations import ACTIVATIONS, CaptureRequest, CaptureResult
from service.schemas.activations import ActivationsRequest
from service.specs.vocab import Capture


@dataclass(frozen=True)
class Activations:
    model: str
    predictions: list[dict[str, Any]] | None  # top-5 of the same forward, for class-score models
    captured: Captured
    layout: TokenLayout | None = None  # the inputs' tokens, for a vision transformer (PNG grids of its tokens)
    tokens: list[int] | None = None  # the tokens kept, when the request chose some


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
        if body.tokens is not None:
            _check_token_layers(model, names, body.capture)
        request = CaptureRequest(tuple(names), body.capture, body.reduce, tuple(nodes), body.tokens)
        fmt = body.format.value
        extra = node_bytes(graph, nodes) if graph is not None else 0

        async def checked_inputs() -> torch.Tensor:
            """The decoded inputs, once the tokens asked for are tokens of their size."""
            x = await self.decode(body.inputs, images, model)
            if body.tokens is not None:
                selected_tokens(body.tokens, _layout(model, x))
            return x

        found: CaptureResult
        x, found = await self.run_admitted(
            served,
            ACTIVATIONS,
            checked_inputs(),
            request=request,
            estimate=lambda x, shapes: activations_cost(x, shapes, request, fmt, extra),
            answer=(fmt, ADVICE_ACTIVATIONS),
            dry_run=body.dry_run,
        )
        output = found.output
        predictions = None
        if isinstance(output, torch.Tensor) and output.ndim == 2:
            predictions = top_k_predictions(output, 5, model.label, include_logits=False)
        layout = token_layout(model.module, tuple(x.shape[1:]))
        chosen = selected_tokens(body.tokens, layout) if body.tokens is not None and layout is not None else None
        return Activations(model.name, predictions, found.captured, layout, chosen)


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


def _layout(model: LoadedModel, x: torch.Tensor) -> TokenLayout:
    layout = token_layout(model.module, tuple(x.shape[1:]))
    if layout is None:
        raise InvalidField(
            f"tokens: {model.name} has no token sequence at inputs of shape {list(x.shape[1:])} (tokens address a "
            "vision transformer's [N, T, D] outputs: class, register and patch tokens)"
        )
    return layout


def _check_token_layers(model: LoadedModel, names: Sequence[str], capture: Capture) -> None:
    """Every captured side of every chosen layer must be a token sequence (at the model's input size)."""
    layout = token_layout(model.module, tuple(model.input_size))
    if layout is None:
        raise InvalidField(
            f"tokens: {model.name} has no token sequence (tokens address a vision transformer's [N, T, D] outputs: "
            "class, register and patch tokens)"
        )
    shapes = model.layer_shapes
    tables = {"output": shapes.outputs, "input": shapes.inputs}
    sides = ("input", "output") if capture is Capture.both else (capture.value,)
    others = [
        f"{key!r} ({side} {list(t.shape[1:])})"
        for key in shapes.keys_of(tuple(names))
        for side in sides
        for t in tables[side].get(key, [])
        if len(t.shape) != 3 or not layout.holds(t.shape[1])
    ]
    if others:
        shown = ", ".join(others[:8]) + (f" and {len(others) - 8} more" if len(others) > 8 else "")
        raise InvalidField(
            f"tokens choose along dim 1 of [N, T, D] token sequences ({layout.count} tokens at the model's input "
            f"size); these give other shapes per input: {shown}. Name layers that give tokens"
        )
