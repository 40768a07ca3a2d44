"""POST /checkpoints/inspect: what is in a checkpoint, without executing any pickle."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from service.api.bodies import read_json, validate
from service.api.deps import PlaneDep
from service.api.openapi import error_responses, register_schema
from service.api.responses import json_response
from service.errors import BadInput, InvalidField
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
    responses=error_responses(400, 403, 404, 409, 413, 422),
)
async def inspect(
    request: Request,
    plane: PlaneDep,
    compare_to: Annotated[
        str | None, Query(description="A model name: report missing/unexpected keys and shape mismatches.")
    ] = None,
    stats: Annotated[bool, Query(description="Add finite statistics to every state-dict entry.")] = False,
) -> Response:
    if request.headers.get("content-type", "").startswith("multipart/form-data"):
        with tempfile.TemporaryDirectory(prefix="hookserve-ckpt-") as tmp:
            path = Path(tmp) / "upload"
            await _save_upload(request, path)
            result = await plane.inspect_checkpoint(path, compare_to, stats)
    else:
        body = validate(CheckpointPath, await read_json(request))
        result = await plane.inspect_checkpoint(plane.checkpoint_path(body.path), compare_to, stats)
    return await json_response(result, plane.settings)


async def _save_upload(request: Request, path: Path) -> None:
    """The form parser spools the file to disk; copy it to a named file torch can mmap."""
    try:
        form = await request.form(max_files=1, max_fields=4)
    except Exception as exc:  # starlette raises several types for malformed forms
        raise BadInput(f"malformed multipart form: {getattr(exc, 'detail', type(exc).__name__)}") from None
    try:
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise InvalidField("multipart requests need a 'file' field holding the checkpoint")

        def copy() -> None:
            with path.open("wb") as out:
                shutil.copyfileobj(upload.file, out, 1024 * 1024)

        await run_in_threadpool(copy)
    finally:
        await form.close()
