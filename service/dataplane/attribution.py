"""Gradients of a class score and attribution maps (saliency) for these inputs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from service.dataplane.base import PlaneBase
from service.dataplane.chunking import fitted, request_limit
from service.dataplane.costs import ADVICE_GRADIENTS, ADVICE_SALIENCY, Estimate, gradients_cost, saliency_cost
from service.dataplane.timing import Work, rows_within
from service.errors import InvalidField
from service.introspection.attribution import MethodParams, SaliencyItem, method_named
from service.introspection.gradients import GradientResult
from service.introspection.layers import resolve_layers
from service.introspection.shapes import LayerShapes
from service.introspection.targets import TargetSpec, check_target
from service.registry.loaded import LoadedModel
from service.runtime.runners.gradients import GRADIENTS
from service.runtime.runners.gradients import GradientsRequest as GradientsRunRequest
from service.runtime.runners.saliency import SaliencyRequest as SaliencyRunRequest
from service.schemas.attribution import GradientsRequest, SaliencyCommon

LIGHTER_TRIES = 8  # cheaper settings tried for the advice of a request past its deadline


@dataclass(frozen=True)
class Gradients:
    model: str
    result: GradientResult


@dataclass(frozen=True)
class Saliency:
    model: LoadedModel  # labels and preprocessing, for the answer's labels and overlays
    method: str
    inputs: torch.Tensor  # the decoded inputs, for overlays
    items: list[SaliencyItem]


class Attribution(PlaneBase):
    """Requests are checked (layers, targets, limits) before their inputs are decoded and join a hooked batch."""

    async def gradients(self, body: GradientsRequest, images: Sequence[bytes] | None) -> Gradients:
        served = self.ready(body.model)
        model = served.model
        names = resolve_layers(model.layer_names, body.layers, self.settings.max_layers) if body.layers else []
        if not names and not body.include_input:
            raise InvalidField("nothing to differentiate: give layers or set include_input to true")
        target: TargetSpec = body.target
        check_target(target, len(body.inputs), model.num_classes, model.labels)
        request = GradientsRunRequest(tuple(names), target, body.include_input)
        fmt = body.format.value
        _, result = await self.run_admitted(
            served,
            GRADIENTS,
            self.decode(body.inputs, images, model),
            request=request,
            estimate=lambda x, shapes: gradients_cost(x, shapes, names, body.include_input, fmt),
            answer=(fmt, ADVICE_GRADIENTS),
            work=lambda x: Work(int(x.shape[0]), int(x.shape[0])),
            dry_run=body.dry_run,
        )
        return Gradients(model.name, result)

    async def saliency(self, body: SaliencyCommon, images: Sequence[bytes] | None) -> Saliency:
        """`body` is one method's request (a `MethodParams` too): limits and layers are checked before any work."""
        if not isinstance(body, MethodParams):
            raise TypeError("a /saliency body is one registered method's request")
        method = method_named(body.method)
        served = self.ready(body.model)
        model = served.model
        method.check_limits(body, self.settings)
        params = method.resolve_layers(body, model.layer_names)
        method.check_model(params, model.module, model.name)
        target: TargetSpec = body.target
        check_target(target, len(body.inputs), model.num_classes, model.labels)

        async def checked_inputs() -> torch.Tensor:
            """The decoded inputs, once the costs that depend on their shape are within limits."""
            inputs = await self.decode(body.inputs, images, model)
            method.check_input(params, tuple(inputs.shape[1:]), self.settings)
            return inputs

        source = method.graph_from(params, model.module)
        fmt = body.format.value
        rows = method.rows_per_input(params)
        advice = ADVICE_SALIENCY + ("" if method.chunked or not method.many_forwards else f", or {method.time_advice}")
        limit = request_limit(self.budget)

        def estimate(x: torch.Tensor, shapes: LayerShapes) -> Estimate:
            def at(chunk: int | None) -> Estimate:
                found = saliency_cost(x, shapes, chunk, source, fmt, rows_per_input=rows)
                return replace(found, rows_per_forward=chunk)

            most = method.chunk(params, self.settings)
            if not method.chunked or most is None:
                return at(most)
            if rows is not None:
                most = max(method.least_rows, min(most, int(x.shape[0]) * rows))
            backward = method.rows_through(params, tuple(x.shape[1:]))[1] > 0
            per_row = self.seconds_per_row(model, x, backward=backward)
            most = rows_within(self.settings.chunk_seconds, per_row, most=most, least=method.least_rows)
            return fitted(at, limit, most=most, least=method.least_rows)

        def work(x: torch.Tensor) -> Work:
            shape, n = tuple(int(s) for s in x.shape[1:]), int(x.shape[0])
            own = 1 if method.many_forwards else 0  # the class scores' forward before the method's own

            def rows(chosen: MethodParams) -> Work:
                forwards, backwards = method.rows_through(chosen, shape)
                return Work(n * (forwards + own), n * backwards, method.time_advice)

            lighter, current = [], method.lighter(params, shape)
            while current is not None and len(lighter) < LIGHTER_TRIES:
                lighter.append((current[1], rows(current[0])))
                current = method.lighter(current[0], shape)
            return replace(rows(params), lighter=tuple(lighter))

        inputs, items = await self.run_admitted(
            served,
            self.saliency_runner,
            checked_inputs(),
            request=None,
            request_for=lambda found: SaliencyRunRequest(params, target, found.rows_per_forward),
            estimate=estimate,
            answer=(fmt, advice),
            work=work,
            dry_run=body.dry_run,
        )
        return Saliency(model, method.name, inputs, items)
