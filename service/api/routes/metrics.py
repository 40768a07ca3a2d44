"""GET /metrics: the Prometheus exposition of this app's collectors."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from service.api.metrics import metrics_of

router = APIRouter(tags=["monitoring"])

_EXAMPLE = (
    "# HELP hookserve_requests_total HTTP requests by route template, method, model and status code.\n"
    "# TYPE hookserve_requests_total counter\n"
    'hookserve_requests_total{method="POST",model="lenet",route="/predict",status="200"} 3.0\n'
    'hookserve_model_state{model="lenet",state="ready"} 1.0\n'
)


@router.get(
    "/metrics",
    summary="Prometheus metrics (text exposition; OpenMetrics when the Accept header asks for it)",
    response_class=Response,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}, "example": _EXAMPLE}}}},
)
def metrics(request: Request) -> Response:
    body, content_type = metrics_of(request.app).render(request.headers.get("accept"))
    return Response(body, media_type=content_type)
