"""A request's layer shapes at its real sample shape, for its memory estimate, before any work.

The shapes probed when the model was loaded are exact at its input size. At any other sample
shape they are propagated on the meta device (`service.introspection.shape_propagation`: no
memory, no arithmetic, cached per model and sample shape). Where the meta device cannot run
the model, one real sample is probed instead, on the model's executor like any hooked work,
but only when that sample is no larger than the model's input size (so the probe costs no
more than the load-time one did); otherwise, and when the model refuses the shape, the
request is refused with the reason.
"""

from __future__ import annotations

import asyncio
import math
from concurrent.futures import Executor

import torch

from service.errors import InvalidField, first_line
from service.introspection.shape_propagation import ShapesUnknown
from service.introspection.shapes import LayerShapes, probe_shapes
from service.runtime.batching import foreign_shape
from service.runtime.fleet import ServedModel


async def shapes_at(served: ServedModel, sample: tuple[int, ...], pool: Executor) -> LayerShapes:
    """The model's layer shapes for samples of shape `sample` (no batch dimension), propagated on `pool`'s
    threads (never on the event loop); 422 when they cannot be known."""
    model = served.model
    at_input = model.layer_shapes
    if sample == at_input.probe or not at_input.probe:
        return at_input
    propagation = model.shape_propagation
    try:
        if propagation is None:
            raise ShapesUnknown("the model was loaded without a meta copy")
        return await asyncio.get_running_loop().run_in_executor(pool, propagation.at, sample)
    except ShapesUnknown as unknown:
        if math.prod(sample) > math.prod(at_input.probe):  # a real probe could cost more than the load-time one
            raise _refusal(served, sample, unknown) from None
    found = await served.executor.run_exclusive(lambda: _probe(served, sample))
    if propagation is not None:
        propagation.remember(sample, found)
    return found


def _refusal(served: ServedModel, sample: tuple[int, ...], unknown: ShapesUnknown) -> InvalidField:
    model = served.model
    if unknown.model_error:
        return foreign_shape(model, list(sample), unknown.reason)
    return InvalidField(
        f"the memory {model.name} needs for samples of shape {list(sample)} cannot be told without running it (its "
        f"layers' shapes do not propagate on the meta device: {unknown.reason}); send samples no larger than its "
        f"input size {model.input_size}"
    )


def _probe(served: ServedModel, sample: tuple[int, ...]) -> LayerShapes:
    """One real zero sample through the eager module with shape hooks (on the executor, alone)."""
    model = served.model
    x = torch.zeros((1, *sample), dtype=model.dtype, device=model.device)
    try:
        return probe_shapes(model.module, x, model.module)
    except (RuntimeError, ValueError, IndexError, AssertionError) as exc:  # timm checks input sizes with asserts
        raise foreign_shape(model, list(sample), first_line(exc)) from None
