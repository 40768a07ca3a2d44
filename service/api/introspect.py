"""Read-only introspection of a loaded model: layers, summary, state dict, optimizer."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Response
from starlette.concurrency import run_in_threadpool

from service.api.openapi import error_responses
from service.api.responses import OCTET, check_binary_size, json_response
from service.api.state import StateDep
from service.codecs.binary import npy_bytes, safetensors_bytes
from service.errors import InvalidField, NotFound
from service.introspection.layers import layer_tree
from service.introspection.optimizer import optimizer_metadata, param_names_for
from service.introspection.state_dict import get_tensor, state_dict_entries
from service.introspection.summary import summarize
from service.schemas.introspection import LayerList, OptimizerInfo, StateDict, Summary
from service.specs.vocab import TensorFileFormat

router = APIRouter(tags=["introspection"])

ModelName = Annotated[str, Path(description="A model name from GET /models.", examples=["lenet"])]
MAX_SUMMARY_DEPTH = 16


@router.get(
    "/models/{name}/layers",
    response_model=LayerList,
    summary="Every named submodule, in named_modules() order",
    responses=error_responses(404, 409),
)
async def layers(name: ModelName, state: StateDep) -> Response:
    model, executor = state.fleet.ready(name)
    tree = await executor.run_shared(lambda: [dataclasses.asdict(node) for node in layer_tree(model.module)])
    return await json_response({"layers": tree}, state.settings)


@router.get(
    "/models/{name}/summary",
    response_model=Summary,
    summary="torchinfo summary (rows and totals equal torchinfo.summary)",
    responses=error_responses(404, 409, 422),
)
async def summary(
    name: ModelName,
    state: StateDep,
    input_size: Annotated[
        str | None,
        Query(
            description="Comma-separated, batch dim included; default 1 + the model's input_size.",
            examples=["1,3,32,32"],
        ),
    ] = None,
    depth: Annotated[int, Query(ge=0, le=MAX_SUMMARY_DEPTH, description="torchinfo's depth.")] = 3,
) -> Response:
    model, executor = state.fleet.ready(name)
    size = _parse_sizes(input_size) if input_size else [1, *model.input_size]
    key = ("summary", tuple(size), depth, str(model.dtype))
    cached = model.summary_cache.get(key)
    if cached is None:
        cached = await executor.run_exclusive(lambda: summarize(model.module, size, depth, model.device, model.dtype))
        model.summary_cache[key] = cached
    return await json_response(cached, state.settings)


def _parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        raise InvalidField(f"input_size {text!r} must be comma-separated integers like 1,3,224,224") from None
    if not sizes or len(sizes) > 6 or any(s <= 0 or s > 8192 for s in sizes):
        raise InvalidField(f"input_size {text!r} must be 1 to 6 positive sizes, each at most 8192")
    numel = 1
    for s in sizes:
        numel *= s
    if numel > 64 * 1024 * 1024:
        raise InvalidField(f"input_size {text!r} is too large for a summary (over 64M elements)")
    return sizes


@router.get(
    "/models/{name}/state-dict",
    response_model=StateDict,
    summary="state_dict metadata (with ?stats=true health statistics) or one tensor as a file",
    responses={
        **error_responses(404, 409, 422),
        200: {
            "content": {OCTET: {}},
            "description": "The metadata, or with `key` and `format` one tensor as .npy or .safetensors.",
        },
    },
)
async def state_dict(
    name: ModelName,
    state: StateDep,
    stats: Annotated[bool, Query(description="Add min, max, mean, std, norm, NaN and Inf counts per entry.")] = False,
    key: Annotated[str | None, Query(description="Download this one tensor (needs `format`).")] = None,
    format: Annotated[TensorFileFormat | None, Query(description="npy | safetensors, with `key`.")] = None,
) -> Response:
    model, executor = state.fleet.ready(name)
    if key is not None:
        tensor = await executor.run_shared(lambda: get_tensor(model.module, key))
        check_binary_size({key: tensor}, state.settings)
        if format is TensorFileFormat.safetensors:  # encoded off the event loop: tensors can be large
            body = await run_in_threadpool(safetensors_bytes, {key: tensor}, {"model": name, "key": key})
        else:
            body = await run_in_threadpool(npy_bytes, tensor)
        ext = (format or TensorFileFormat.npy).value
        return Response(body, media_type=OCTET, headers={"Content-Disposition": f'attachment; filename="{key}.{ext}"'})
    if format is not None:
        raise InvalidField("format needs key: the tensor to download")
    data = await executor.run_shared(lambda: state_dict_entries(model.module, stats))
    return await json_response(data, state.settings)


@router.get(
    "/models/{name}/optimizer",
    response_model=OptimizerInfo,
    summary="Optimizer state_dict metadata with parameter names",
    responses=error_responses(404, 409),
)
async def optimizer(name: ModelName, state: StateDep) -> Response:
    model, executor = state.fleet.ready(name)
    opt = model.optimizer
    if opt is None:
        raise NotFound(f"model {name!r} has no optimizer (configure [models.optimizer] or load a training checkpoint)")

    def describe() -> dict[str, Any]:
        return optimizer_metadata(type(opt).__name__, opt.state_dict(), param_names_for(model.module, opt))

    return await json_response(await executor.run_shared(describe), state.settings)
