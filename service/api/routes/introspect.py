"""What a loaded model is made of: its layers, torchinfo summary, state dict and optimizer state."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from service.api.deps import PlaneDep, ReadyModel
from service.api.openapi import error_responses
from service.api.responses import file_response, json_response
from service.codecs.formats import OCTET
from service.errors import InvalidField
from service.schemas.introspection import LayerList, OptimizerInfo, StateDict, Summary
from service.specs.vocab import TensorFileFormat

router = APIRouter(tags=["introspection"])

MAX_SUMMARY_DEPTH = 16


@router.get(
    "/models/{name}/layers",
    response_model=LayerList,
    summary="Every named submodule, in named_modules() order",
    responses=error_responses(404, 409),
)
async def layers(model: ReadyModel, plane: PlaneDep) -> Response:
    return await json_response({"layers": await plane.layers(model)}, plane.settings)


@router.get(
    "/models/{name}/summary",
    response_model=Summary,
    summary="torchinfo summary (rows and totals equal torchinfo.summary)",
    responses=error_responses(404, 409, 422),
)
async def summary(
    model: ReadyModel,
    plane: PlaneDep,
    input_size: Annotated[
        str | None,
        Query(
            description="Comma-separated, batch dim included; default 1 + the model's input_size.",
            examples=["1,3,32,32"],
        ),
    ] = None,
    depth: Annotated[int, Query(ge=0, le=MAX_SUMMARY_DEPTH, description="torchinfo's depth.")] = 3,
) -> Response:
    sizes = _parse_sizes(input_size) if input_size else None
    return await json_response(await plane.summary(model, sizes, depth), plane.settings)


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
    model: ReadyModel,
    plane: PlaneDep,
    stats: Annotated[bool, Query(description="Add min, max, mean, std, norm, NaN and Inf counts per entry.")] = False,
    key: Annotated[str | None, Query(description="Download this one tensor (needs `format`).")] = None,
    format: Annotated[TensorFileFormat | None, Query(description="npy | safetensors, with `key`.")] = None,
) -> Response:
    if key is not None:
        tensor = await plane.tensor(model, key)
        fmt = format or TensorFileFormat.npy
        return await file_response(fmt.value, {key: tensor}, {"model": model.name, "key": key}, plane.settings, key)
    if format is not None:
        raise InvalidField("format needs key: the tensor to download")
    return await json_response(await plane.state_dict(model, stats), plane.settings)


@router.get(
    "/models/{name}/optimizer",
    response_model=OptimizerInfo,
    summary="Optimizer state_dict metadata with parameter names",
    responses=error_responses(404, 409),
)
async def optimizer(model: ReadyModel, plane: PlaneDep) -> Response:
    return await json_response(await plane.optimizer(model), plane.settings)
