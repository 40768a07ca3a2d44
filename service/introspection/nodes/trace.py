"""Tracing a model into its functional nodes, named as torchvision's `get_graph_node_names` names them.

The tracer is torchvision's `NodePathTracer` with the defaults of `get_graph_node_names` (torchvision
ops as leaves, `math` and `torchvision.ops` functions wrapped), run once in the module's own mode:
the served module is never switched to train (DESIGN.md invariant 3), so the names are the
eval-mode list. The trace is safe beside forwards on other threads (`fx_tracing`).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from dataclasses import dataclass
from typing import Any

import torch
import torchvision
from torch import Tensor, fx, nn
from torch.fx.node import _get_qualified_name
from torchvision.models.feature_extraction import NodePathTracer

from service.dtypes import dtype_name
from service.errors import first_line, scrub_paths
from service.introspection.fx_tracing import TRACING, ThreadLocalTracing
from service.introspection.nodes.graph import NodeGraph, NodeInfo, run_nodes


@dataclass(frozen=True)
class Untraceable:
    """Why a model has no node graph (the tracer's or the graph's first error line); module capture still works."""

    reason: str


def trace_nodes(model: nn.Module, example: Tensor) -> NodeGraph | Untraceable:
    """Trace `model` once and run the graph on `example` (a batch at the model's input size) for shapes.

    The GraphModule shares `model`'s submodules; run it only where the model may run (its executor,
    holding it as a hooked job does). A graph that fails on the example is Untraceable too.
    """
    tracer = _Tracer()
    try:
        with TRACING:
            graph = tracer.trace(model)
        module = fx.GraphModule(tracer.root, graph, type(model).__name__)
    except Exception as exc:  # TraceError, TypeError on int(proxy), NotImplementedError, ...
        return Untraceable(f"FX cannot trace it: {_reason(exc)}")
    module.training = model.training  # on the copy only: `train()` would reach the shared submodules
    names: dict[fx.Node, str] = dict(tracer.node_to_qualname)
    if len(set(names.values())) != len(names):
        return Untraceable("FX traced it into nodes with duplicate names")
    nodes = NodeGraph(module, {name: node for node, name in names.items()})
    outputs: dict[str, Any] = {}

    def record(name: str, value: Any) -> Any:
        outputs[name] = (_shape(value), dtype_name(value.dtype) if isinstance(value, Tensor) else None)
        return value

    try:
        with torch.inference_mode():
            run_nodes(nodes, example, nodes.names, record)
    except torch.OutOfMemoryError:
        raise
    except Exception as exc:
        return Untraceable(f"its traced graph fails on a batch of shape {list(example.shape)}: {_reason(exc)}")
    info = tuple(
        _info(node, name=name, names=names, owners=tracer.owners, model=model, output=outputs.get(name, (None, None)))
        for node, name in names.items()
    )
    return dataclasses.replace(nodes, info=info, input_size=tuple(example.shape))


class _Tracer(ThreadLocalTracing, NodePathTracer):  # type: ignore[misc]  # torchvision is untyped
    """torchvision's NodePathTracer with its defaults, recording the module each node runs in."""

    def __init__(self) -> None:
        defaults: dict[str, Any] = {  # get_graph_node_names' defaults
            "autowrap_modules": (math, torchvision.ops),
            "leaf_modules": _torchvision_op_modules(),
        }
        super().__init__(**defaults)
        self.owners: dict[fx.Node, str] = {}

    def create_proxy(self, *args: Any, **kwargs: Any) -> fx.Proxy:
        proxy: fx.Proxy = super().create_proxy(*args, **kwargs)
        self.owners[proxy.node] = self.current_module_qualname
        return proxy


def _torchvision_op_modules() -> list[type[nn.Module]]:
    """torchvision.ops' module classes: leaves, as in torchvision's feature extraction defaults."""
    return [
        obj for _, obj in inspect.getmembers(torchvision.ops) if inspect.isclass(obj) and issubclass(obj, nn.Module)
    ]


def _info(
    node: fx.Node,
    *,
    name: str,
    names: dict[fx.Node, str],
    owners: dict[fx.Node, str],
    model: nn.Module,
    output: tuple[list[Any] | None, str | None],
) -> NodeInfo:
    module = str(node.target) if node.op == "call_module" else owners.get(node, "")
    return NodeInfo(
        name=name,
        op=node.op,
        target=_target(node),
        module=module,
        module_type=type(model.get_submodule(module)).__name__,
        inputs=[names[n] for n in node.all_input_nodes if n in names],
        shape=output[0],
        dtype=output[1],
    )


def _target(node: fx.Node) -> str:
    """What a node calls: a module path, a method or attribute name, or a function's dotted name."""
    target = node.target
    if isinstance(target, str):
        return target
    try:
        name = _get_qualified_name(target)
    except Exception:  # a callable FX cannot name (a lambda, a bound method)
        return getattr(target, "__name__", None) or type(target).__name__
    return name.removeprefix("_")  # `_operator.add` is `operator.add`


def _shape(value: Any) -> list[Any] | None:
    """A tensor's shape; a list of its elements' shapes for a container (None for non-tensors)."""
    if isinstance(value, Tensor):
        return list(value.shape)
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)) and any(isinstance(v, (Tensor, tuple, list, dict)) for v in value):
        return [_shape(v) for v in value]
    return None


def _reason(exc: BaseException) -> str:
    return scrub_paths(first_line(exc))
