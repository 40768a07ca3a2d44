"""POST /gradients: d(target logit)/d(layer outputs) and d/d(input)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from service.api.bodies import parse_body
from service.api.deps import PlaneDep
from service.api.observability import set_request_model
from service.api.openapi import BINARY_OR_PNG, body_with_multipart, error_responses
from service.api.responses import file_response, json_response
from service.codecs.tensors import json_tensor
from service.schemas.attribution import GradientsRequest, GradientsResponse
from service.specs.vocab import TensorFormat

router = APIRouter(tags=["introspection"])


@router.post(
    "/gradients",
    response_model=GradientsResponse,
    summary="d(target logit)/d(layer outputs) and d/d(input)",
    openapi_extra=body_with_multipart(GradientsRequest),
    responses={**error_responses(400, 404, 409, 413, 422, 503), **BINARY_OR_PNG},
)
async def gradients(request: Request, plane: PlaneDep) -> Response:
    parsed = await parse_body(request, GradientsRequest, plane.settings)
    set_request_model(request, parsed.body.model)
    found = await plane.gradients(parsed.body, parsed.images)
    result, fmt = found.result, parsed.body.format
    head = {"model": found.model, "targets": result.targets, "scores": result.scores}
    if fmt is not TensorFormat.json:
        rest = head | {"gradients": {k: {"shape": list(v.shape)} for k, v in result.gradients.items()}}
        return await file_response(fmt.value, result.gradients, rest, plane.settings, "gradients")
    numel = sum(g.numel() for g in result.gradients.values())
    content = head | {"gradients": {k: json_tensor(v) for k, v in result.gradients.items()}}
    return await json_response(content, plane.settings, numel=numel)
