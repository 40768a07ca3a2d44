"""GET /models/{name}/nodes: the functional (FX graph) nodes /activations can capture beside module paths."""

from __future__ import annotations

from fastapi import APIRouter, Response

from service.api.deps import PlaneDep, ReadyModel
from service.api.openapi import error_responses
from service.api.responses import json_response
from service.schemas.nodes import NodeList

router = APIRouter(tags=["introspection"])


@router.get(
    "/models/{name}/nodes",
    response_model=NodeList,
    summary="FX graph nodes with torchvision's names (e.g. layer1.0.add), their op, module and output shape",
    description=(
        "Traced on first request and kept; names are those of torchvision's get_graph_node_names (eval mode). "
        "A model FX cannot trace answers 422 with the tracer's reason; module capture (`layers`) still works for it."
    ),
    responses=error_responses(404, 409, 422),
)
async def nodes(model: ReadyModel, plane: PlaneDep) -> Response:
    return await json_response(await plane.nodes(model), plane.settings)
