"""Interventions and channel sweeps: checked against the model's layers and shapes before any work."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from service.codecs.tensors import tensor_from_payload
from service.dataplane.base import PlaneBase
from service.dataplane.costs import Estimate, activations_cost, predict_cost
from service.dataplane.nodes import node_graph
from service.errors import InvalidField, TooLarge
from service.introspection.capture import Captured
from service.introspection.interventions import EditOp, Fired, Selection
from service.introspection.layers import closest_names, resolve_layers
from service.introspection.nodes import NodeGraph, node_bytes, resolve_nodes
from service.introspection.predictions import require_class_scores, top_k_predictions
from service.introspection.shapes import LayerShapes
from service.introspection.targets import check_target, resolve_targets, target_scores
from service.registry.loaded import LoadedModel
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
from service.schemas.interventions import Edit, InterventionsRequest
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
        shapes = model.layer_shapes.outputs.get(site_key(body.site, body.call), [])
        width = shapes[0].shape[1] if shapes and len(shapes[0].shape) >= 2 else 0
        start, stop = body.channels or [0, width]
        if stop > width:
            raise InvalidField(f"channels {[start, stop]} are out of range: {body.site!r} gives {width} channels")
        rows = len(body.inputs) * (stop - start)
        if rows > self.settings.max_sweep_rows:
            raise TooLarge(
                f"sweeping {stop - start} channels over {len(body.inputs)} inputs runs {rows} ablated inputs, over "
                f"the limit of {self.settings.max_sweep_rows} (max_sweep_rows); sweep a smaller range of channels"
            )
        check_target(body.target, len(body.inputs), model.num_classes, model.labels)
        request = SweepRequest(
            body.site, body.call, body.op, tuple(range(start, stop)), body.target, self.settings.max_batch_size * 4
        )
        _, result = await self.run_admitted(
            served,
            SWEEP,
            self.decode(body.inputs, images, model),
            request=request,
            estimate=lambda x, shapes: _sweep_cost(x, shapes, request.rows_per_forward),
            answer=("json", "sweep a smaller range of channels"),
        )
        return Sweep(model.name, body.site, body.call, body.op, result)

    def _edit(
        self, index: int, edit: Edit, model: LoadedModel, body: InterventionsRequest, graph: NodeGraph | None
    ) -> EditOp:
        """The schema's edit as the torch side's, its site, call, channels, source and tensor checked first."""
        site = edit.node if graph is not None else edit.site
        assert site is not None  # the schema requires one of them
        if graph is not None:
            shape = _node_shape(graph, index, site)
        else:
            _check_site(model, site, edit.call)
            shapes = model.layer_shapes.outputs.get(site_key(site, edit.call), [])
            if len(shapes) != 1:
                raise InvalidField(f"edit {index}: {site!r} gives {len(shapes)} tensors; edits need one")
            shape = shapes[0].shape
        if edit.channels is not None:
            width = shape[1] if len(shape) >= 2 else 0
            bad = [c for c in edit.channels if c >= width]
            if bad:
                raise InvalidField(f"edit {index}: channels {bad} are out of range: {site!r} gives {width}")
        tensor = None
        payload: TensorPayload | None = getattr(edit, "tensor", None)
        if payload is not None:
            tensor = self._tensor(index, payload)
        source = getattr(edit, "source", None)
        if source is not None and source not in body.sources:
            raise InvalidField(f"edit {index}: no source named {source!r} (sources: {sorted(body.sources)})")
        return EditOp(
            index=index,
            site=site,
            call=edit.call,
            selection=Selection(
                tuple(edit.channels) if edit.channels is not None else None,
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
        )

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
    chunk = torch.empty((max(rows_per_forward, int(x.shape[0])), *x.shape[1:]), dtype=x.dtype, device="meta")
    return predict_cost(chunk, shapes)


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
    return {
        "edit": op.index,
        "site": op.site,
        "call": op.call,
        "op": op.op,
        "shape": fired.shape,
        "elements": fired.elements,
    }
