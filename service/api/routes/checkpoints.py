"""POST /checkpoints/inspect: what is in a checkpoint, without executing any pickle."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from service.api.bodies import is_multipart, read_json, validate
from service.api.deps import StateDep
from service.api.openapi import error_responses, register_schema
from service.api.responses import json_response
from service.api.uploads import received_upload
from service.schemas.introspection import CheckpointInspection, CheckpointPath

router = APIRouter(tags=["introspection"])
register_schema(CheckpointPath)

_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "properties": {"file": {"type": "string", "format": "binary", "description": "The checkpoint."}},
                    "required": ["file"],
                }
            },
            "application/json": {"schema": {"$ref": "#/components/schemas/CheckpointPath"}},
        },
    }
}


@router.post(
    "/checkpoints/inspect",
    response_model=CheckpointInspection,
    summary="State dicts, optimizer states and scalars in a checkpoint; never runs a pickle",
    openapi_extra=_BODY,
    responses=error_responses(400, 403, 404, 409, 413, 422, 503),
)
async def inspect(
    request: Request,
    state: StateDep,
    compare_to: Annotated[
        str | None, Query(description="A model name: report missing/unexpected keys and shape mismatches.")
    ] = None,
    stats: Annotated[bool, Query(description="Add finite statistics to every state-dict entry.")] = False,
) -> Response:
    plane = state.plane
    if is_multipart(request.headers.get("content-type")):
        async with received_upload(request, state.uploads) as path:
            result = await plane.inspect_checkpoint(path, compare_to, stats)
    else:
        body = validate(CheckpointPath, await read_json(request))
        result = await plane.inspect_checkpoint(plane.checkpoint_path(body.path), compare_to, stats)
    return await json_response(result, plane.settings)
