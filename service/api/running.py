"""The shared path of every model-running request: parse, look up, decode off the loop."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Generic, TypeVar

import torch
from fastapi import Request

from service.api.inputs import parse_body
from service.api.observability import set_request_model
from service.api.state import AppState
from service.codecs.inputs import decode_batch
from service.registry.loaded import LoadedModel
from service.runtime.executor import ModelExecutor
from service.schemas.common import ModelInputs

B = TypeVar("B", bound=ModelInputs)


@dataclass
class Prepared(Generic[B]):
    body: B
    model: LoadedModel
    executor: ModelExecutor
    inputs: torch.Tensor


async def prepare(request: Request, state: AppState, body_cls: type[B], *, announce: bool = False) -> Prepared[B]:
    """Validate the body, find the ready model, decode its inputs on the decode pool.

    With `announce`, the executor is told a prediction is on its way (so a batch may wait
    for it); the caller must pass `announced=True` to `executor.predict`.
    """
    parsed = await parse_body(request, body_cls, state.settings)
    set_request_model(request, parsed.body.model)
    model, executor = state.fleet.ready(parsed.body.model)
    if announce:
        executor.announce()
    try:
        loop = asyncio.get_running_loop()
        inputs = await loop.run_in_executor(
            state.decode_pool, decode_batch, parsed.body.inputs, parsed.images, model, state.settings.max_image_pixels
        )
    except BaseException:
        if announce:
            executor.withdraw()
        raise
    return Prepared(parsed.body, model, executor, inputs)
