"""POST /activations: inputs/outputs of named layers, captured by hooks that live for this request only."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from service.api.bodies import parse_body
from service.api.captures import captures_answer
from service.api.deps import PlaneDep
from service.api.observability import set_request_model
from service.api.openapi import body_with_multipart, error_responses
from service.codecs.formats import OCTET
from service.config import Settings
from service.dataplane.inspection import Activations
from service.introspection.tokens import token_names
from service.schemas.activations import ActivationsRequest, ActivationsResponse

router = APIRouter(tags=["introspection"])


@router.post(
    "/activations",
    response_model=ActivationsResponse,
    summary="Inputs/outputs of named layers for these inputs (JSON, stats, safetensors, npz or a PNG grid)",
    openapi_extra=body_with_multipart(ActivationsRequest),
    responses={
        **error_responses(400, 404, 409, 413, 422, 503),
        200: {"content": {OCTET: {}, "image/png": {}}, "description": "JSON, a binary file, or a PNG."},
    },
)
async def activations(request: Request, plane: PlaneDep) -> Response:
    parsed = await parse_body(request, ActivationsRequest, plane.settings)
    set_request_model(request, parsed.body.model)
    result = await plane.activations(parsed.body, parsed.images)
    return await _answer(result, parsed.body, plane.settings)


async def _answer(result: Activations, body: ActivationsRequest, settings: Settings) -> Response:
    head: dict[str, object] = {"model": result.model, "predictions": result.predictions}
    if result.tokens is not None and result.layout is not None:
        names = token_names(result.tokens, result.layout)
        head["tokens"] = result.layout.describe() | {"indices": result.tokens, "names": names}
    picture = (body.png_layer, body.channels)
    return await captures_answer(
        head, result.captured, body.format, settings, filename="activations", picture=picture, tokens=result.layout
    )
