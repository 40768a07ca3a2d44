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
from service.introspection.capture import Captured, capture_by_layer
from service.introspection.hooks import HookScope
from service.introspection.interventions import Donors, EditHooks, EditOp, Fired, Means, RowEdits, Selection
from service.introspection.targets import TargetSpec, class_scores, resolve_targets, target_scores
from service.introspection.tensor_stats import reduce_tensor
from service.registry.loaded import LoadedModel
from service.runtime.batching import forward_checked, split_output, to_cpu, to_device
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

        def plain() -> Any:
            with torch.inference_mode():
                return forward_checked(model, reference)

        ref_output, seen, _ = capture_by_layer(model.module, read, Capture.output, plain)
        ref_total = start
        ref = _Reference(seen, ref_total, spans)
        row_edits = [
            RowEdits(a, b, request.edits, donors=ref.donors_of(i), means=ref.means_of((a, b)))
            for i, (request, (a, b)) in enumerate(zip(requests, base, strict=True))
        ]
        layers = list(dict.fromkeys(layer for r in requests for layer in r.layers))
        modes = {r.capture for r in requests if r.layers}
        mode = modes.pop() if len(modes) == 1 else Capture.both
        x = to_device(concatenated(inputs), model)
        hooks = EditHooks(model.module, row_edits)

        def edited_forward() -> Any:
            with torch.inference_mode():
                return forward_checked(model, x)

        with HookScope(model.module) as scope:
            hooks.register(scope)  # before the captures: a capture at an edited site sees the edited output
            output, captured, keys = capture_by_layer(model.module, layers, mode, edited_forward)
        sizes = [b - a for a, b in base]
        clean = split_output(to_cpu(ref_output), [*sizes, ref_total - total])[: len(requests)]
        edited = split_output(to_cpu(output), sizes) if len(requests) > 1 else [to_cpu(output)]
        layer_of = {key: layer for layer, found in keys.items() for key in found}
        answers: list[Any] = []
        for request, span, edits, before, after in zip(requests, base, row_edits, clean, edited, strict=True):
            missing = [e for e in request.edits if e.index not in edits.fired]
            if missing:
                e = missing[0]
                answers.append(
                    InvalidField(
                        f"edit {e.index} ({e.op} at {e.site!r}, call {e.call}) never fired: {e.site!r} ran "
                        f"{hooks.calls.get(e.site, 0)} time(s) in the forward"
                    )
                )
                continue
            mine, sides = set(request.layers), _SIDES[request.capture]
            own: Captured = {}
            for key, found in captured.items():
                if layer_of[key] in mine:
                    picked = {s: rows(t, span, total) for s, t in found.items() if s in sides}
                    own[key] = {s: reduce_tensor(t, request.reduce) for s, t in picked.items()}
            answers.append(InterventionResult(before, after, dict(edits.fired), own))
        return answers


def _reads_reference(edit: EditOp) -> bool:
    """`patch` reads a donor run, batch `mean` the clean run: both read the reference forward."""
    return edit.op == "patch" or (edit.op == "mean" and edit.over == "batch")


@dataclass(frozen=True)
class _Reference:
    """The reference forward's captures at the sites edits read, and whose rows are where."""

    seen: Captured
    total: int
    spans: dict[tuple[int, str], tuple[int, int]]  # (request, source) -> its donor rows

    def at(self, key: str, span: tuple[int, int], what: str) -> Tensor:
        found = self.seen.get(key, {}).get("output")
        if found is None:
            raise InvalidField(f"{what} never reached {key!r}, so it has nothing to give there")
        return rows(found, span, self.total)

    def donors_of(self, request: int) -> Donors:
        def donor(source: str, site: str, call: int) -> Tensor:
            return self.at(site_key(site, call), self.spans[(request, source)], f"source {source!r}")

        return donor

    def means_of(self, span: tuple[int, int]) -> Means:
        def clean(site: str, call: int) -> Tensor:
            return self.at(site_key(site, call), span, "the clean run")

        return clean


@dataclass(frozen=True)
class SweepRequest:
    site: str
    call: int
    op: str  # zero | mean
    channels: tuple[int, ...]
    target: TargetSpec
    rows_per_forward: int


@dataclass
class SweepResult:
    targets: list[int]
    clean: list[float]  # each input's target score
    deltas: dict[int, list[float]]  # channel -> each input's change of its target score


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
                RowEdits(j * n, (j + 1) * n, [_ablate(request, channel)], _no_donors, _no_means)
                for j, channel in enumerate(chunk)
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


def _ablate(request: SweepRequest, channel: int) -> EditOp:
    return EditOp(0, request.site, request.call, Selection(channels=(channel,)), request.op)


def _no_donors(source: str, site: str, call: int) -> Tensor:
    raise InvalidField("a sweep has no sources")


def _no_means(site: str, call: int) -> Tensor:
    raise InvalidField("a sweep ablates with the spatial mean")


INTERVENTIONS = InterventionsRunner()
SWEEP = SweepRunner()
