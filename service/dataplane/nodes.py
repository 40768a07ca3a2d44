"""Functional nodes: a model's FX graph, traced on its executor when first asked for and kept with the model."""

from __future__ import annotations

import dataclasses
from typing import Any

from service.dataplane.base import PlaneBase
from service.errors import InvalidField
from service.introspection.nodes import NodeGraph, Untraceable, trace_nodes
from service.registry.loaded import LoadedModel
from service.registry.probes import Placement
from service.runtime.fleet import ServedModel


async def node_graph(served: ServedModel) -> NodeGraph:
    """The model's node graph; a model FX cannot trace is a 422 with the tracer's reason (module capture still works).

    The trace runs once, as an exclusive job (its shapes come from a forward of the shared
    submodules), and its outcome, failure included, is kept on the loaded model.
    """
    model = served.model
    found = model.node_graph
    if found is None:
        found = await served.executor.run_exclusive(lambda: _traced(model))
    if isinstance(found, Untraceable):
        raise InvalidField(
            f"{model.name} has no functional nodes: {found.reason}. "
            "Module capture works for it: name module paths from GET /models/{name}/layers in `layers`"
        )
    return found


def _traced(model: LoadedModel) -> NodeGraph | Untraceable:
    if model.node_graph is None:  # a request queued behind another's trace finds it done
        example = Placement(model.input_size, model.device, model.dtype, model.channels_last).probe(1)
        model.node_graph = trace_nodes(model.module, example)
    return model.node_graph


class Nodes(PlaneBase):
    async def nodes(self, served: ServedModel) -> dict[str, Any]:
        """Every named node in graph order, with its op, target, module, inputs and output shape."""
        graph = await node_graph(served)
        return {
            "model": served.model.name,
            "input_size": list(graph.input_size),
            "nodes": [dataclasses.asdict(info) for info in graph.info],
        }
