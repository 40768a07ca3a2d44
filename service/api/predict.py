"""POST /predict."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from service.api.openapi import body_with_multipart, error_responses
from service.api.responses import json_response
from service.api.running import prepare
from service.api.state import StateDep
from service.runtime.predictions import require_class_scores, top_k_predictions
from service.schemas.predict import PredictRequest, PredictResponse

router = APIRouter(tags=["inference"])


@router.post(
    "/predict",
    response_model=PredictResponse,
    summary="Class predictions (top-k softmax) for each input",
    openapi_extra=body_with_multipart(PredictRequest),
    responses=error_responses(400, 404, 409, 413, 422, 503),
)
async def predict(request: Request, state: StateDep) -> Response:
    job = await prepare(request, state, PredictRequest, announce=True)
    body, model = job.body, job.model

    def post(output: Any) -> list[dict[str, Any]]:
        return top_k_predictions(require_class_scores(output, model), body.top_k, model, body.include_logits)

    predictions = await job.executor.predict(job.inputs, post, announced=True)
    return await json_response({"model": model.name, "predictions": predictions}, state.settings)
