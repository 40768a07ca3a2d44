"""Interventions and channel sweeps: checked against the model's layers and shapes before any work."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from service.codecs.tensors import tensor_from_payload
from service.dataplane.base import PlaneBase
from service.dataplane.chunking import fitted, request_limit
from service.dataplane.costs import Estimate, activations_cost, predict_cost
from service.dataplane.nodes import node_graph
from service.dataplane.timing import Work, rows_within
from service.errors import InvalidField, NotFound, TooLarge
from service.introspection.capture import Captured
from service.introspection.interventions import EditOp, Fired, Selection
from service.introspection.layers import closest_names, resolve_layers
from service.introspection.nodes import NodeGraph, node_bytes, resolve_nodes
from service.introspection.predictions import require_class_scores, top_k_predictions
from service.introspection.shapes import LayerShapes
from service.introspection.targets import check_target, resolve_targets, target_scores
from service.introspection.tokens import TokenSelection, selected_tokens, token_layout
from service.registry.loaded import LoadedModel
from service.registry.steering_vectors import vectors_at, vectors_dir
from service.runtime.admission import Cost
from service.runtime.runners.activations import CaptureRequest
from service.runtime.runners.interventions import (
    INTERVENTIONS,
    SWEEP,
    InterventionRequest,
    InterventionResult,
    SweepRequest,
    SweepResult,
    site_key,
)
from service.schemas.common import TensorPayload
from service.schemas.interventions import AddEdit, Edit, InterventionsRequest
from service.schemas.interventions import SweepRequest as SweepBody

ADVICE = "ask for fewer edits, sources, layers or inputs, a reduce, or format=stats"


@dataclass(frozen=True)
class Interventions:
    model: LoadedModel
    clean: list[dict[str, Any]]  # top-k (and logits) without the edits
    edited: list[dict[str, Any]]
    change: list[dict[str, Any]]
    applied: list[dict[str, Any]]
    captured: Captured


@dataclass(frozen=True)
class Sweep:
    model: str
    site: str
    call: int
    op: str
    result: SweepResult
    over: str = "channels"  # or "heads"


class Experiments(PlaneBase):
    async def interventions(self, body: InterventionsRequest, images: Sequence[bytes] | None) -> Interventions:
        served = self.ready(body.model)
        model = served.model
        s = self.settings
        if len(body.edits) > s.max_edits:
            raise TooLarge(f"{len(body.edits)} edits, over the limit of {s.max_edits} (max_edits)")
        if len(body.sources) > s.max_sources:
            raise TooLarge(f"{len(body.sources)} sources, over the limit of {s.max_sources} (max_sources)")
        at_nodes = any(edit.node is not None for edit in body.edits)
        if at_nodes and any(edit.site is not None for edit in body.edits):
            raise InvalidField("edits are either all at modules (`site`) or all at functional nodes (`node`)")
        graph = await node_graph(served) if at_nodes else None
        if graph is None and body.nodes:
            raise InvalidField("`nodes` captures go with edits at functional nodes; capture `layers` here")
        if graph is not None and body.layers:
            raise InvalidField("with edits at functional nodes, capture `nodes`, not `layers`")
        edits = tuple(self._edit(i, edit, model, body, graph) for i, edit in enumerate(body.edits))
        layers = resolve_layers(model.layer_names, body.layers, s.max_layers) if body.layers else []
        nodes = resolve_nodes(graph, body.nodes, s.max_layers) if graph is not None and body.nodes else []
        check_target(body.target, len(body.inputs), model.num_classes, model.labels)
        sources = {name: await self.decode(items, None, model) for name, items in body.sources.items()}
        n = len(body.inputs)
        for name, donor in sources.items():
            if donor.shape[0] not in (1, n):
                raise InvalidField(f"source {name!r} has {donor.shape[0]} inputs; give 1 (for every input) or {n}")
        request = InterventionRequest(
            edits, sources, tuple(layers), body.capture, body.reduce, at_nodes=at_nodes, nodes=tuple(nodes)
        )
        fmt = body.format.value
        extra = node_bytes(graph, nodes) if graph is not None else 0
        found: InterventionResult
        _, found = await self.run_admitted(
            served,
            INTERVENTIONS,
            self._decoded_like(body, images, model, sources),
            request=request,
            estimate=lambda x, shapes: _cost(x, shapes, request, sources, fmt, node_bytes=extra),
            answer=(fmt, ADVICE),
            work=lambda x: Work(2 * int(x.shape[0]) + sum(int(d.shape[0]) for d in sources.values())),
            dry_run=body.dry_run,
        )
        clean = require_class_scores(found.clean, model.name)
        edited = require_class_scores(found.edited, model.name)
        return Interventions(
            model,
            top_k_predictions(clean, body.top_k, model.label, body.include_logits),
            top_k_predictions(edited, body.top_k, model.label, body.include_logits),
            _changes(clean, edited, resolve_targets(body.target, clean, model.labels), model),
            [_applied(op, found.fired[op.index]) for op in edits],
            found.captured,
        )

    async def sweep(self, body: SweepBody, images: Sequence[bytes] | None) -> Sweep:
        served = self.ready(body.model)
        model = served.model
        _check_site(model, body.site, body.call)
        units = _sweep_units(model, body)
        rows = len(body.inputs) * len(units.numbers)
        if rows > self.settings.max_sweep_rows:
            raise TooLarge(
                f"sweeping {len(units.numbers)} {body.over} over {len(body.inputs)} inputs runs {rows} ablated inputs, "
                f"over the limit of {self.settings.max_sweep_rows} (max_sweep_rows); sweep a smaller range"
            )
        check_target(body.target, len(body.inputs), model.num_classes, model.labels)
        request = SweepRequest(
            units.site,
            body.call,
            body.op,
            units.numbers,
            body.target,
            self.settings.max_batch_size * 4,
            groups=units.groups,
            side=units.side,
            token_axis=units.token_axis,
        )
        _, result = await self.run_admitted(
            served,
            SWEEP,
            self.decode(body.inputs, images, model),
            request=request,
            estimate=lambda x, shapes: fitted(
                lambda rows: _sweep_cost(x, shapes, rows),
                request_limit(self.budget),
                most=rows_within(
                    self.settings.chunk_seconds,
                    self.seconds_per_row(model, x, backward=False),
                    most=max(len(x), request.rows_per_forward),
                    least=len(x),
                ),
                least=len(x),
            ),
            request_for=lambda found: replace(request, rows_per_forward=found.rows_per_forward or len(body.inputs)),
            answer=("json", "send fewer or smaller inputs"),
            work=lambda x: Work(int(x.shape[0]) * (len(units.numbers) + 1), advice="sweep a smaller range"),
            dry_run=body.dry_run,
        )
        return Sweep(model.name, body.site, body.call, body.op, result, body.over)

    def _edit(
        self, index: int, edit: Edit, model: LoadedModel, body: InterventionsRequest, graph: NodeGraph | None
    ) -> EditOp:
        """The schema's edit as the torch side's, its site, call, channels, source and tensor checked first."""
        site = edit.node if graph is not None else edit.site
        assert site is not None  # the schema requires one of them
        where = Where(site)
        if graph is not None:
            if edit.tokens is not None:
                raise InvalidField(f"edit {index}: tokens address the outputs of modules (`site`), not of nodes")
            shape = _node_shape(graph, index, site)
        else:
            _check_site(model, site, edit.call)
            where = _where(index, model, site, edit.heads)
            table = model.layer_shapes.inputs if where.side == "input" else model.layer_shapes.outputs
            shapes = table.get(site_key(where.site, edit.call), [])
            if len(shapes) != 1:
                raise InvalidField(f"edit {index}: {site!r} gives {len(shapes)} tensors; edits need one")
            shape = shapes[0].shape
        tokens = _tokens(index, model, site, shape, edit.tokens, edit.y is not None or edit.x is not None)
        channels = edit.channels if where.channels is None else list(where.channels)
        if channels is not None:
            axis = -1 if tokens.axis else 1
            width = shape[axis] if len(shape) >= 2 else 0
            bad = [c for c in channels if c >= width]
            if bad:
                raise InvalidField(f"edit {index}: channels {bad} are out of range: {site!r} gives {width}")
        tensor = None
        payload: TensorPayload | None = getattr(edit, "tensor", None)
        if payload is not None:
            tensor = self._tensor(index, payload)
        if isinstance(edit, AddEdit) and edit.vector is not None:
            tensor = self._steering(index, edit, model, site_key(where.site, edit.call), where.side)
        source = getattr(edit, "source", None)
        if source is not None and source not in body.sources:
            raise InvalidField(f"edit {index}: no source named {source!r} (sources: {sorted(body.sources)})")
        return EditOp(
            index=index,
            site=where.site,
            call=edit.call,
            selection=Selection(
                tuple(channels) if channels is not None else None,
                (edit.y[0], edit.y[1]) if edit.y is not None else None,
                (edit.x[0], edit.x[1]) if edit.x is not None else None,
            ),
            op=edit.op,
            factor=getattr(edit, "factor", 1.0),
            value=getattr(edit, "value", None),
            low=getattr(edit, "min", None),
            high=getattr(edit, "max", None),
            tensor=tensor,
            over=getattr(edit, "over", "spatial"),
            std=getattr(edit, "std", 0.0),
            seed=getattr(edit, "seed", 0),
            source=source,
            side=where.side,
            token_axis=tokens.axis,
            tokens=tokens.indices,
            token_count=tokens.count,
            heads=tuple(edit.heads) if edit.heads is not None else None,
            attention=site if edit.heads is not None else None,
        )

    def _steering(self, index: int, edit: AddEdit, model: LoadedModel, key: str, side: str) -> torch.Tensor:
        """A stored steering vector times the edit's scale, where it was taken only (same model, layer and call)."""
        assert edit.vector is not None
        try:
            vector = vectors_at(vectors_dir(self.settings)).get(edit.vector)
        except NotFound as exc:
            raise InvalidField(f"edit {index}: {exc.detail}") from None
        if (vector.model, vector.layer, "output") != (model.name, key, side):
            raise InvalidField(
                f"edit {index}: the steering vector {edit.vector!r} was taken at the output of {vector.layer!r} of "
                f"model {vector.model!r}; add it there (site {vector.layer.split('#')[0]!r})"
            )
        return vector.tensor * edit.scale

    def _tensor(self, index: int, payload: TensorPayload) -> torch.Tensor:
        numel = 1
        for size in payload.shape:
            numel *= max(0, size)
        if numel * 8 > self.settings.max_edit_tensor_bytes:
            raise TooLarge(
                f"edit {index}: a tensor of shape {payload.shape} is over the limit of "
                f"{self.settings.max_edit_tensor_bytes} bytes (max_edit_tensor_bytes)"
            )
        t = tensor_from_payload(payload.shape, payload.dtype, payload.data, payload.b64, f"edits[{index}].tensor")
        t = t.float()
        if not bool(torch.isfinite(t).all()):
            raise InvalidField(f"edit {index}: the tensor holds NaN or infinite values")
        return t

    async def _decoded_like(
        self,
        body: InterventionsRequest,
        images: Sequence[bytes] | None,
        model: LoadedModel,
        sources: dict[str, torch.Tensor],
    ) -> torch.Tensor:
        """The base inputs; donors must have their sample shape (patching reads the same site of both)."""
        x = await self.decode(body.inputs, images, model)
        for name, donor in sources.items():
            if donor.shape[1:] != x.shape[1:]:
                raise InvalidField(
                    f"source {name!r} decodes to samples of shape {list(donor.shape[1:])}, the inputs to "
                    f"{list(x.shape[1:])}: donors must match the inputs"
                )
        return x


@dataclass(frozen=True)
class Where:
    """Where an edit applies: a module's output, or (heads) the input of the module where an attention
    module's heads meet, on those heads' channels."""

    site: str
    side: str = "output"
    channels: tuple[int, ...] | None = None


def _where(index: int, model: LoadedModel, site: str, heads: Sequence[int] | None) -> Where:
    if heads is None:
        return Where(site)
    found = model.attention
    attention = found.sites.get(site)
    if attention is None:
        found.require(model.name)
        listed = ", ".join(repr(s) for s in list(found.sites)[:6]) + (", ..." if len(found.sites) > 6 else "")
        raise InvalidField(f"edit {index}: heads are edited at an attention module, and {site!r} is not one: {listed}")
    bad = [h for h in heads if h >= attention.heads]
    if bad:
        raise InvalidField(f"edit {index}: heads {bad} are out of range: {site!r} has {attention.heads}")
    width = attention.head_dim
    channels = tuple(c for h in dict.fromkeys(heads) for c in range(h * width, (h + 1) * width))
    return Where(attention.heads_at, "input", channels)


@dataclass(frozen=True)
class Tokens:
    """How an edit reads a token sequence: whether the site gives one, and the positions chosen along dim 1."""

    axis: bool = False
    indices: tuple[int, ...] | None = None
    count: int | None = None


def _tokens(  # noqa: PLR0917
    index: int, model: LoadedModel, site: str, shape: tuple[int, ...], chosen: TokenSelection | None, spatial: bool
) -> Tokens:
    """The token positions an edit chooses at a site of `shape` (one input, at the model's input size)."""
    layout = token_layout(model.module, tuple(model.input_size))
    sequence = layout is not None and len(shape) == 3 and layout.holds(shape[1])
    if sequence and spatial:
        raise InvalidField(f"edit {index}: {site!r} gives tokens [N, T, D]; choose them with `tokens`, not y/x")
    if chosen is None:
        return Tokens(sequence)
    if layout is None or not sequence:
        raise InvalidField(
            f"edit {index}: tokens choose along dim 1 of a vision transformer's token sequence [N, T, D]; {site!r} "
            f"gives {list(shape[1:])}"
        )
    indices = selected_tokens(chosen, layout)
    if shape[1] == layout.patches and shape[1] != layout.count:  # patch tokens alone (patch_embed's output)
        first = len(layout.prefix)
        if any(i < first for i in indices):
            raise InvalidField(f"edit {index}: {site!r} holds the patch tokens alone, without {list(layout.prefix)}")
        indices = [i - first for i in indices]
    return Tokens(True, tuple(indices), shape[1])


@dataclass(frozen=True)
class SweepUnits:
    """What a sweep ablates in turn: channels of a site's output, or heads where they meet."""

    site: str
    numbers: tuple[int, ...]
    groups: tuple[tuple[int, ...], ...] | None = None
    side: str = "output"
    token_axis: bool = False


def _sweep_units(model: LoadedModel, body: SweepBody) -> SweepUnits:
    if body.over == "heads":
        found = model.attention
        attention = found.sites.get(body.site)
        if attention is None:
            found.require(model.name)
            raise InvalidField(f"a sweep over heads needs an attention module as `site`: {list(found.sites)[:6]}")
        start, stop = body.heads or [0, attention.heads]
        if stop > attention.heads:
            raise InvalidField(f"heads {[start, stop]} are out of range: {body.site!r} has {attention.heads} heads")
        width = attention.head_dim
        groups = tuple(tuple(range(h * width, (h + 1) * width)) for h in range(start, stop))
        return SweepUnits(attention.heads_at, tuple(range(start, stop)), groups, "input", token_axis=True)
    shapes = model.layer_shapes.outputs.get(site_key(body.site, body.call), [])
    shape = shapes[0].shape if shapes else ()
    layout = token_layout(model.module, tuple(model.input_size))
    sequence = layout is not None and len(shape) == 3 and layout.holds(shape[1])
    width = shape[-1 if sequence else 1] if len(shape) >= 2 else 0
    start, stop = body.channels or [0, width]
    if stop > width:
        raise InvalidField(f"channels {[start, stop]} are out of range: {body.site!r} gives {width} channels")
    return SweepUnits(body.site, tuple(range(start, stop)), token_axis=sequence)


def _node_shape(graph: NodeGraph, index: int, name: str) -> tuple[int, ...]:
    """The node's output shape (batch of one), or a 422: unknown node (with the closest), or no single tensor."""
    found = {info.name: info for info in graph.info}
    info = found.get(name)
    if info is None:
        close = closest_names(name, list(found))
        hint = f"; closest: {', '.join(repr(c) for c in close)}" if close else ""
        raise InvalidField(f"edit {index}: unknown node {name!r}{hint} (GET /models/{{name}}/nodes lists them)")
    if info.shape is None or any(not isinstance(s, int) for s in info.shape):
        raise InvalidField(f"edit {index}: node {name!r} gives no single tensor; edits need one")
    return tuple(int(s) for s in info.shape)


def _check_site(model: LoadedModel, site: str, call: int) -> None:
    if site not in model.layer_names:
        close = closest_names(site, list(model.layer_names))
        hint = f"; closest: {', '.join(repr(c) for c in close)}" if close else ""
        raise InvalidField(f"unknown site {site!r}{hint} (GET /models/{{name}}/layers lists them)")
    calls = sum(1 for layer in model.layer_shapes.layer_of.values() if layer == site)
    if call > calls:
        raise InvalidField(f"{site!r} runs {calls} time(s) per forward; there is no call {call}")


def _cost(
    x: torch.Tensor,
    shapes: LayerShapes,
    request: InterventionRequest,
    sources: dict[str, torch.Tensor],
    fmt: str,
    *,
    node_bytes: int,
) -> Estimate:
    captured = CaptureRequest(request.layers, request.capture, request.reduce)
    captures = activations_cost(x, shapes, captured, fmt, node_bytes)
    donors = sum(int(d.shape[0]) for d in sources.values())
    forward = predict_cost(x, shapes).cost.parts.get("forward", 0)
    parts = dict(captures.cost.parts)
    parts["forward"] = forward * 2 + (forward // max(1, int(x.shape[0]))) * donors  # reference and edited forwards
    return Estimate(Cost(parts), captures.answer_numel, captures.answer_bytes)


def _sweep_cost(x: torch.Tensor, shapes: LayerShapes, rows_per_forward: int) -> Estimate:
    """A forward of `rows_per_forward` ablated rows (at least one per input) at a time."""
    rows = max(rows_per_forward, int(x.shape[0]))
    chunk = torch.empty((rows, *x.shape[1:]), dtype=x.dtype, device="meta")
    return replace(predict_cost(chunk, shapes), rows_per_forward=rows)


def _changes(clean: torch.Tensor, edited: torch.Tensor, targets: list[int], model: LoadedModel) -> list[dict[str, Any]]:
    before = target_scores(clean, targets).float().tolist()
    after = target_scores(edited, targets).float().tolist()
    p = clean.float().log_softmax(dim=1)
    q = edited.float().log_softmax(dim=1)
    kl = (p.exp() * (p - q)).sum(dim=1).clamp(min=0.0).tolist()
    return [
        {
            "target": t,
            "label": model.label(t),
            "clean_score": b,
            "edited_score": a,
            "delta": a - b,
            "kl_divergence": k,
        }
        for t, b, a, k in zip(targets, before, after, kl, strict=True)
    ]


def _applied(op: EditOp, fired: Fired) -> dict[str, Any]:
    """What fired where; `heads` and `tokens` only for edits that chose them."""
    chosen = {"heads": op.heads, "tokens": op.tokens}
    return {
        "edit": op.index,
        "site": op.attention or op.site,
        "call": op.call,
        "op": op.op,
        "shape": fired.shape,
        "elements": fired.elements,
    } | {key: list(value) for key, value in chosen.items() if value is not None}
