"""Interventions of several requests in two forwards over their concatenated rows, and channel sweeps.

The reference forward runs every request's base inputs and donor inputs without edits,
capturing the sites that `patch` and batch-`mean` edits read; the edited forward runs the base
inputs again with each request's edits on its own rows (and captures of later layers). A sweep
ablates each channel of one layer in turn, in chunks of rows, one forward per chunk.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from service.errors import InvalidField
from service.introspection.capture import Captured, capture_by_layer, flatten_tensors
from service.introspection.copies import detached_copy
from service.introspection.hooks import HookScope
from service.introspection.interventions import Donors, EditHooks, EditOp, Editor, Fired, Means, RowEdits, Selection
from service.introspection.nodes import NodeGraph, run_nodes
from service.introspection.targets import TargetSpec, class_scores, resolve_targets, target_scores
from service.introspection.tensor_stats import reduce_tensor
from service.registry.loaded import LoadedModel
from service.runtime.batching import (
    capture_at_nodes,
    capture_layers,
    foreign_shape_errors,
    forward_checked,
    split_output,
    to_cpu,
    to_device,
)
from service.runtime.runners.base import Runner, concatenated, offsets, rows
from service.specs.vocab import Capture, Reduce

_SIDES = {Capture.output: ("output",), Capture.input: ("input",), Capture.both: ("input", "output")}


@dataclass(frozen=True)
class InterventionRequest:
    edits: tuple[EditOp, ...]
    sources: dict[str, Tensor] = field(default_factory=dict)  # decoded donor inputs [M, ...], M = 1 or N
    layers: tuple[str, ...] = ()  # captured after the edits
    capture: Capture = Capture.output
    reduce: Reduce | None = None
    at_nodes: bool = False  # the edits' sites are functional nodes (run through the node graph)
    nodes: tuple[str, ...] = ()  # nodes captured after the edits (with edits at nodes)


@dataclass
class InterventionResult:
    clean: Any  # this request's rows of the model's output without edits (CPU)
    edited: Any  # and with them
    fired: dict[int, Fired]
    captured: Captured


def site_key(site: str, call: int) -> str:
    return site if call == 1 else f"{site}#{call}"


class InterventionsRunner(Runner[InterventionRequest]):
    name = "interventions"
    hooked = True

    def short(self, request: InterventionRequest) -> bool:
        return False  # two forwards (three with donors): never every core

    def run(self, model: LoadedModel, inputs: Sequence[Tensor], requests: Sequence[InterventionRequest]) -> list[Any]:
        """Requests with edits at modules run through module hooks, those at functional nodes through the graph."""
        answers: list[Any] = [None] * len(requests)
        for at_nodes in (False, True):
            chosen = [i for i, r in enumerate(requests) if r.at_nodes == at_nodes]
            if chosen:
                found = _intervene(model, [inputs[i] for i in chosen], [requests[i] for i in chosen], at_nodes)
                for i, answer in zip(chosen, found, strict=True):
                    answers[i] = answer
        return answers


def _intervene(
    model: LoadedModel, inputs: Sequence[Tensor], requests: Sequence[InterventionRequest], at_nodes: bool
) -> list[Any]:
    base = offsets(inputs)
    total = base[-1][1]
    donors: list[Tensor] = []
    spans: dict[tuple[int, str], tuple[int, int]] = {}  # (request, source) -> rows in the reference batch
    start = total
    for i, request in enumerate(requests):
        for name, donor in request.sources.items():
            spans[(i, name)] = (start, start + int(donor.shape[0]))
            donors.append(donor)
            start += int(donor.shape[0])
    reference = to_device(torch.cat([concatenated(inputs), *donors]) if donors else concatenated(inputs), model)
    read = sorted({e.site for r in requests for e in r.edits if _reads_reference(e)})
    read_sides = {e.side for r in requests for e in r.edits if _reads_reference(e)}
    forward = _NodeForward(model) if at_nodes else _ModuleForward(model)
    if read:
        ref_output, seen = forward.reference(reference, read, Capture.both if "input" in read_sides else Capture.output)
    else:  # no edit reads the clean forward: it is a prediction, on the prediction path
        with torch.inference_mode():
            ref_output, seen = forward_checked(model, reference, model.prediction_module), {}
    ref = _Reference(seen, start, spans)
    row_edits = [
        RowEdits(a, b, request.edits, donors=ref.donors_of(i), means=ref.means_of((a, b)))
        for i, (request, (a, b)) in enumerate(zip(requests, base, strict=True))
    ]
    output, captured, site_of, calls = forward.edited(to_device(concatenated(inputs), model), requests, row_edits)
    sizes = [b - a for a, b in base]
    clean = split_output(to_cpu(ref_output), [*sizes, start - total])[: len(requests)]
    edited = split_output(to_cpu(output), sizes) if len(requests) > 1 else [to_cpu(output)]
    answers: list[Any] = []
    for request, span, edits, before, after in zip(requests, base, row_edits, clean, edited, strict=True):
        missing = [e for e in request.edits if e.index not in edits.fired]
        if missing:
            e = missing[0]
            where = f"node {e.site!r}" if at_nodes else f"{e.site!r}, call {e.call}"
            answers.append(
                InvalidField(
                    f"edit {e.index} ({e.op} at {where}) never fired: {e.site!r} ran {calls.get(e.site, 0)} time(s) "
                    "in the forward"
                )
            )
            continue
        mine = set(request.nodes if at_nodes else request.layers)
        sides = ("output",) if at_nodes else _SIDES[request.capture]
        own: Captured = {}
        for key, found in captured.items():
            if site_of[key] in mine:
                picked = {s: rows(t, span, total) for s, t in found.items() if s in sides}
                own[key] = {s: reduce_tensor(t, request.reduce) for s, t in picked.items()}
        answers.append(InterventionResult(before, after, dict(edits.fired), own))
    return answers


class _ModuleForward:
    """Forwards of the served module: captures and edits by module hooks."""

    def __init__(self, model: LoadedModel) -> None:
        self.model = model

    def reference(self, x: Tensor, read: Sequence[str], mode: Capture) -> tuple[Any, Captured]:
        """The clean forward reading `read`: on their capture plan when there is one (a set repeated a few times
        gets one built), else by hooks on this lane."""
        plan = self.model.capture_plans.plan_for(list(read), mode, x)
        output, seen, _ = capture_layers(self.model, list(read), mode, x, plan)
        return output, seen

    def edited(
        self, x: Tensor, requests: Sequence[InterventionRequest], row_edits: Sequence[RowEdits]
    ) -> tuple[Any, Captured, dict[str, str], dict[str, int]]:
        layers = list(dict.fromkeys(layer for r in requests for layer in r.layers))
        modes = {r.capture for r in requests if r.layers}
        mode = modes.pop() if len(modes) == 1 else Capture.both
        hooks = EditHooks(self.model.module, row_edits)
        with HookScope(self.model.module) as scope:
            hooks.register(scope)  # before the captures: a capture at an edited site sees the edited output
            output, captured, keys = capture_by_layer(self.model.module, layers, mode, lambda: self._forward(x))
        site_of = {key: layer for layer, found in keys.items() for key in found}
        return output, captured, site_of, hooks.calls

    def _forward(self, x: Tensor) -> Any:
        with torch.inference_mode():
            return forward_checked(self.model, x)


class _NodeForward:
    """Runs of the model's node graph: the chosen nodes read (and replaced) as they finish."""

    def __init__(self, model: LoadedModel) -> None:
        graph = model.node_graph
        if not isinstance(graph, NodeGraph):
            raise RuntimeError(f"{model.name} has no node graph: the data plane traces it before node edits")
        self.model = model
        self.graph = graph

    def reference(self, x: Tensor, read: Sequence[str], mode: Capture) -> tuple[Any, Captured]:
        """The clean forward reading the nodes `read`: on their capture plan when there is one, else on the graph."""
        plan = self.model.capture_plans.plan_for(list(read), Capture.output, x, nodes=self.graph)
        output, seen, _ = capture_at_nodes(self.model, self.graph, list(read), x, plan)
        return output, seen

    def edited(
        self, x: Tensor, requests: Sequence[InterventionRequest], row_edits: Sequence[RowEdits]
    ) -> tuple[Any, Captured, dict[str, str], dict[str, int]]:
        editor = Editor(row_edits)
        capture = list(dict.fromkeys(node for r in requests for node in r.nodes))
        captured: Captured = {}
        site_of: dict[str, str] = {}
        calls: dict[str, int] = {}

        def on_node(name: str, value: Any) -> Any:
            calls[name] = calls.get(name, 0) + 1
            edited = editor.edit(name, 1, value)
            value = value if edited is None else edited
            if name in capture:
                for key, t in flatten_tensors(name, value):
                    captured[key] = {"output": detached_copy(t).cpu()}
                    site_of[key] = name
            return value

        sites = list(dict.fromkeys([*editor.sites(), *capture]))
        with torch.inference_mode(), foreign_shape_errors(self.model, x):
            output = run_nodes(self.graph, x, sites, on_node)
        return output, captured, site_of, calls


def _reads_reference(edit: EditOp) -> bool:
    """`patch` reads a donor run, batch `mean` the clean run: both read the reference forward."""
    return edit.op == "patch" or (edit.op == "mean" and edit.over == "batch")


@dataclass(frozen=True)
class _Reference:
    """The reference forward's captures at the sites edits read, and whose rows are where."""

    seen: Captured
    total: int
    spans: dict[tuple[int, str], tuple[int, int]]  # (request, source) -> its donor rows

    def at(self, key: str, span: tuple[int, int], what: str, side: str) -> Tensor:
        found = self.seen.get(key, {}).get(side)
        if found is None:
            raise InvalidField(f"{what} never reached {key!r}, so it has nothing to give there")
        return rows(found, span, self.total)

    def donors_of(self, request: int) -> Donors:
        def donor(source: str, site: str, call: int, side: str) -> Tensor:
            return self.at(site_key(site, call), self.spans[(request, source)], f"source {source!r}", side)

        return donor

    def means_of(self, span: tuple[int, int]) -> Means:
        def clean(site: str, call: int, side: str) -> Tensor:
            return self.at(site_key(site, call), span, "the clean run", side)

        return clean


@dataclass(frozen=True)
class SweepRequest:
    site: str
    call: int
    op: str  # zero | mean
    channels: tuple[int, ...]  # the units swept, by their number (a channel, or a head)
    target: TargetSpec
    rows_per_forward: int
    groups: tuple[tuple[int, ...], ...] | None = None  # each unit's channels (a head's), when not one channel
    side: str = "output"  # where the channels are: the site's output, or its input (heads where they meet)
    token_axis: bool = False  # the site gives tokens [N, T, D]: channels are its last dim


@dataclass
class SweepResult:
    targets: list[int]
    clean: list[float]  # each input's target score
    deltas: dict[int, list[float]]  # unit (channel or head) -> each input's change of its target score


class SweepRunner(Runner[SweepRequest]):
    """One sweep at a time (its own chunks are its batches); each chunk's forward can stop an abandoned sweep."""

    name = "sweep"
    hooked = True

    def key(self, request: SweepRequest) -> Hashable:
        return id(request)  # never merged with another sweep

    def short(self, request: SweepRequest) -> bool:
        return False

    def run(self, model: LoadedModel, inputs: Sequence[Tensor], requests: Sequence[SweepRequest]) -> list[Any]:
        return [self._sweep(model, x, request) for x, request in zip(inputs, requests, strict=True)]

    def _sweep(self, model: LoadedModel, x: Tensor, request: SweepRequest) -> SweepResult:
        x = to_device(x, model)
        n = int(x.shape[0])
        with torch.inference_mode():
            logits = class_scores(forward_checked(model, x))
        targets = resolve_targets(request.target, logits, model.labels)
        clean = target_scores(logits, targets).float()
        per_forward = max(1, request.rows_per_forward // n)
        deltas: dict[int, list[float]] = {}
        for start in range(0, len(request.channels), per_forward):
            chunk = request.channels[start : start + per_forward]
            batch = x.repeat(len(chunk), *([1] * (x.ndim - 1)))
            edits = [
                RowEdits(j * n, (j + 1) * n, [_ablate(request, start + j)], _no_donors, _no_means)
                for j in range(len(chunk))
            ]
            hooks = EditHooks(model.module, edits)
            with HookScope(model.module) as scope, torch.inference_mode():
                hooks.register(scope)
                scores = class_scores(forward_checked(model, batch))
            if not edits[0].fired:
                raise InvalidField(
                    f"{request.site!r} call {request.call} never ran: it ran {hooks.calls.get(request.site, 0)} time(s)"
                )
            changed = (target_scores(scores, targets * len(chunk)).float() - clean.repeat(len(chunk))).reshape(
                len(chunk), n
            )
            for channel, row in zip(chunk, changed.tolist(), strict=True):
                deltas[channel] = row
        return SweepResult(targets, clean.tolist(), deltas)


def _ablate(request: SweepRequest, position: int) -> EditOp:
    """The edit that ablates the sweep's `position`-th unit: one channel, or a head's channels."""
    channels = request.groups[position] if request.groups is not None else (request.channels[position],)
    selection = Selection(channels=channels)
    return EditOp(
        0, request.site, request.call, selection, request.op, side=request.side, token_axis=request.token_axis
    )


def _no_donors(source: str, site: str, call: int, side: str) -> Tensor:
    raise InvalidField("a sweep has no sources")


def _no_means(site: str, call: int, side: str) -> Tensor:
    raise InvalidField("a sweep ablates with the spatial mean")


INTERVENTIONS = InterventionsRunner()
SWEEP = SweepRunner()
