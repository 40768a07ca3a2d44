"""POST /predict."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from service.api.bodies import parse_body
from service.api.deps import PlaneDep
from service.api.observability import set_request_model
from service.api.openapi import body_with_multipart, error_responses
from service.api.responses import json_response
from service.schemas.predict import PredictRequest, PredictResponse

router = APIRouter(tags=["inference"])


@router.post(
    "/predict",
    response_model=PredictResponse,
    summary="Class predictions (top-k softmax) for each input",
    openapi_extra=body_with_multipart(PredictRequest),
    responses=error_responses(400, 404, 409, 413, 422, 503),
)
async def predict(request: Request, plane: PlaneDep) -> Response:
    parsed = await parse_body(request, PredictRequest, plane.settings)
    set_request_model(request, parsed.body.model)
    result = await plane.predict(parsed.body, parsed.images)
    return await json_response({"model": result.model, "predictions": result.predictions}, plane.settings)
