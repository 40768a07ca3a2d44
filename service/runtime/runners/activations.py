"""Activations of several requests from one hooked forward over their concatenated inputs.

Hooks go on the union of the requests' layers (capturing both sides when their captures
differ); each request then takes its own rows, layers, sides and `name#k` calls, and its own
reduction, so its answer equals the one it would get alone (up to the kernels' rounding
for another batch size). Requests that name FX nodes share one run of the model's node graph
over their concatenated inputs the same way; a request naming both gets both, its layers'
keys first.
Layer captures run on the model's capture plan (ONNX Runtime) once one is built for the batch's
capture set, on the hooked lane otherwise; either gives the same keys, shapes and order.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from service.errors import InvalidField
from service.introspection.capture import Captured
from service.introspection.nodes import NodeGraph
from service.introspection.tensor_stats import reduce_tensor
from service.introspection.tokens import TokenLayout, TokenSelection, selected_tokens, take_tokens, token_layout
from service.registry.loaded import LoadedModel
from service.runtime.batching import capture_at_nodes, capture_layers, split_output, to_cpu, to_device
from service.runtime.runners.base import NotSplittable, Runner, concatenated, offsets, rows
from service.specs.vocab import Capture, Reduce

_SIDES = {Capture.output: ("output",), Capture.input: ("input",), Capture.both: ("input", "output")}


@dataclass(frozen=True)
class CaptureRequest:
    layers: tuple[str, ...]
    capture: Capture = Capture.output
    reduce: Reduce | None = None
    nodes: tuple[str, ...] = ()  # FX node names; the model's node graph is traced before the request is queued
    tokens: TokenSelection | None = None  # a vision transformer's tokens to keep (checked before queueing)
    bulk: bool = False  # one of many batches of this capture set (a data-set job): its plan is built at once


@dataclass
class CaptureResult:
    captured: Captured
    output: Any  # this request's rows of the model's output, on the CPU


@dataclass(frozen=True)
class _Pick:
    """What one request takes from a batched capture: the keys of its sites, these sides, reduced so."""

    sites: tuple[str, ...]
    sides: tuple[str, ...]
    reduce: Reduce | None
    tokens: list[int] | None = None  # indices along dim 1 of token sequences


class ActivationsRunner(Runner[CaptureRequest]):
    name = "activations"
    hooked = True

    def key(self, request: CaptureRequest) -> Hashable:
        return ()

    def run(self, model: LoadedModel, inputs: Sequence[torch.Tensor], requests: Sequence[CaptureRequest]) -> list[Any]:
        by_layers = [i for i, request in enumerate(requests) if request.layers]
        by_nodes = [i for i, request in enumerate(requests) if request.nodes]
        results: dict[int, Any] = {}
        if by_layers:
            found = _by_layers(model, [inputs[i] for i in by_layers], [requests[i] for i in by_layers])
            results.update(zip(by_layers, found, strict=True))
        if by_nodes:
            found = _by_nodes(model, [inputs[i] for i in by_nodes], [requests[i] for i in by_nodes])
            for i, result in zip(by_nodes, found, strict=True):
                results[i] = _merged(results[i], result) if i in results else result
        return [results[i] for i in range(len(requests))]


def _by_layers(model: LoadedModel, inputs: Sequence[torch.Tensor], requests: Sequence[CaptureRequest]) -> list[Any]:
    """Hooks on the union of the requests' layers, one eager forward, each request's own part."""
    layers = list(dict.fromkeys(layer for request in requests for layer in request.layers))
    modes = {request.capture for request in requests}
    mode = modes.pop() if len(modes) == 1 else Capture.both
    x = to_device(concatenated(inputs), model)
    mixed = len({(frozenset(r.layers), r.capture) for r in requests}) > 1
    layout = token_layout(model.module, tuple(x.shape[1:]))
    at_once, reduce = any(r.bulk for r in requests), _common_reduce(requests) if layout is None else None
    plan = model.capture_plans.plan_for(layers, mode, x, at_once=at_once, learn=not mixed, reduce=reduce)
    output, captured, keys = capture_layers(model, layers, mode, x, plan)
    picks = [
        _Pick(
            r.layers,
            _SIDES[r.capture],
            r.reduce,
            selected_tokens(r.tokens, layout) if r.tokens is not None and layout is not None else None,
        )
        for r in requests
    ]
    return _answers(inputs, output, captured, keys, picks, layout)


def _by_nodes(model: LoadedModel, inputs: Sequence[torch.Tensor], requests: Sequence[CaptureRequest]) -> list[Any]:
    """One run of the node graph capturing the union of the requests' nodes, each request's own part."""
    graph = model.node_graph
    if not isinstance(graph, NodeGraph):
        raise RuntimeError(f"{model.name} has no node graph: the data plane traces it before queueing a node capture")
    nodes = list(dict.fromkeys(node for request in requests for node in request.nodes))
    x = to_device(concatenated(inputs), model)
    mixed = len({frozenset(r.nodes) for r in requests}) > 1
    at_once = any(r.bulk for r in requests)
    reduce = _common_reduce(requests)
    plan = model.capture_plans.plan_for(
        nodes, Capture.output, x, at_once=at_once, learn=not mixed, nodes=graph, reduce=reduce
    )
    output, captured, keys = capture_at_nodes(model, graph, nodes, x, plan)
    picks = [_Pick(r.nodes, ("output",), r.reduce) for r in requests]
    return _answers(inputs, output, captured, keys, picks)


def _common_reduce(requests: Sequence[CaptureRequest]) -> Reduce | None:
    """The reduction every request of the batch asks, which a plan may do inside its graph (`_answers` reducing an
    already reduced `[N, C]` capture leaves it as it is); None when they differ, or ask none or tokens."""
    reduces = {r.reduce for r in requests}
    reduce = reduces.pop() if len(reduces) == 1 else None
    return reduce if all(r.tokens is None for r in requests) else None


def _answers(  # noqa: PLR0917
    inputs: Sequence[torch.Tensor],
    output: Any,
    captured: Captured,
    keys: dict[str, list[str]],
    picks: list[_Pick],
    layout: TokenLayout | None = None,
) -> list[Any]:
    """Each request's rows of the model's output and of its own sites' keys and sides, its tokens of a vision
    transformer's sequences, reduced as it asks (a token sequence over its tokens: `[N, D]`)."""
    bounds = offsets(inputs)
    total = bounds[-1][1]
    single = len(inputs) == 1
    outputs = [to_cpu(output)] if single else split_output(to_cpu(output), [b - a for a, b in bounds])
    site_of = {key: site for site, found in keys.items() for key in found}
    answers: list[Any] = []
    for pick, span, out in zip(picks, bounds, outputs, strict=True):
        mine = set(pick.sites)
        own: Captured = {}
        for key, found in captured.items():
            if site_of[key] not in mine:
                continue
            picked = {side: t if single else rows(t, span, total) for side, t in found.items() if side in pick.sides}
            sequences = {side: is_sequence(t, layout) for side, t in picked.items()}
            if pick.tokens is not None and layout is not None:
                picked = {side: take_tokens(t, pick.tokens, layout, repr(key)) for side, t in picked.items()}
            if picked:
                own[key] = {side: reduce_sequence(t, pick.reduce, sequences[side]) for side, t in picked.items()}
        answers.append(CaptureResult(own, out))
    return answers


def _merged(layers: CaptureResult, nodes: CaptureResult) -> CaptureResult | InvalidField:
    """A request's layer captures, then its node captures; a key both give is that request's 422."""
    both = [key for key in nodes.captured if key in layers.captured]
    if both:
        return InvalidField(f"{', '.join(repr(k) for k in both)}: captured by both a layer and a node; ask for it once")
    return CaptureResult(layers.captured | nodes.captured, layers.output)


def is_sequence(t: torch.Tensor, layout: TokenLayout | None) -> bool:
    """Whether `t` is a vision transformer's token sequence `[N, T, D]` of the inputs' layout."""
    return layout is not None and t.ndim == 3 and layout.holds(int(t.shape[1]))


def reduce_sequence(t: torch.Tensor, reduce: Reduce | None, sequence: bool) -> torch.Tensor:
    """`reduce_tensor`, except that mean and max of a token sequence `[N, T, D]` go over the tokens: `[N, D]`."""
    if sequence and reduce in (Reduce.mean, Reduce.max):
        return reduce_tensor(t.transpose(1, 2), reduce)
    return reduce_tensor(t, reduce)


ACTIVATIONS = ActivationsRunner()
__all__ = ["ACTIVATIONS", "ActivationsRunner", "CaptureRequest", "CaptureResult", "NotSplittable"]
