"""POST /interventions (edit layer outputs and watch the prediction move) and POST /interventions/sweep."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from service.api.bodies import parse_body
from service.api.captures import captures_answer
from service.api.deps import PlaneDep
from service.api.observability import set_request_model
from service.api.openapi import BINARY_OR_PNG, body_with_multipart, error_responses
from service.api.responses import json_response
from service.schemas.interventions import InterventionsRequest, InterventionsResponse, SweepRequest, SweepResponse

router = APIRouter(tags=["experiments"])


@router.post(
    "/interventions",
    response_model=InterventionsResponse,
    summary="Edit layer outputs in one forward (zero, scale, add, clamp, mean, noise, patch, set): top-k before "
    "and after, the target's change, what fired where, captures after the edits",
    openapi_extra=body_with_multipart(InterventionsRequest),
    responses={**error_responses(400, 404, 409, 413, 422, 503), **BINARY_OR_PNG},
)
async def interventions(request: Request, plane: PlaneDep) -> Response:
    parsed = await parse_body(request, InterventionsRequest, plane.settings)
    body = parsed.body
    set_request_model(request, body.model)
    found = await plane.interventions(body, parsed.images)
    head = {
        "model": found.model.name,
        "clean": found.clean,
        "edited": found.edited,
        "change": found.change,
        "applied": found.applied,
    }
    if not body.layers and not body.nodes:
        return await json_response(head, plane.settings)
    return await captures_answer(head, found.captured, body.format, plane.settings, filename="interventions")


@router.post(
    "/interventions/sweep",
    response_model=SweepResponse,
    summary="Ablate each channel of a layer in turn (batched) and rank the channels by the target score's change",
    description="With `over=heads`, the heads of an attention module instead of channels.",
    openapi_extra=body_with_multipart(SweepRequest),
    responses=error_responses(400, 404, 409, 413, 422, 503),
)
async def sweep(request: Request, plane: PlaneDep) -> Response:
    parsed = await parse_body(request, SweepRequest, plane.settings)
    set_request_model(request, parsed.body.model)
    found = await plane.sweep(parsed.body, parsed.images)
    result = found.result
    unit = "head" if found.over == "heads" else "channel"
    effects = [
        {unit: number, "delta": sum(deltas) / len(deltas), "deltas": deltas} for number, deltas in result.deltas.items()
    ]
    effects.sort(key=lambda effect: (effect["delta"], effect[unit]))
    answer = {
        "model": found.model,
        "site": found.site,
        "call": found.call,
        "op": found.op,
        "targets": result.targets,
        "clean_scores": result.clean,
        "over": found.over,
        "channels": effects if unit == "channel" else [],
    } | ({"heads": effects} if unit == "head" else {})
    return await json_response(answer, plane.settings)
