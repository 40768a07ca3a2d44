"""A model's functional nodes as an FX graph, and forwards that read or replace chosen nodes' outputs.

`NodeGraph` (built once per model by `trace.trace_nodes`) holds a GraphModule that shares the
model's submodules and parameters but is a module of its own; nothing here registers a hook,
on it or on the model. `run_nodes` runs the graph under an `fx.Interpreter` that hands each
chosen node's output to a callback and carries on with what the callback returns, so one
forward can both read and replace nodes: a capture keeps a clone and returns the value, an
edit returns a new one. Callers hold the model as a hooked job does (its submodules run here).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, fx

from service.errors import InvalidField
from service.introspection.capture import Captured, flatten_tensors
from service.introspection.copies import detached_copy
from service.introspection.layers import resolve_names

_WILDCARDS = frozenset("*?[")

OnNode = Callable[[str, Any], Any]
"""`on_node(name, output) -> output`: called as each chosen node finishes; what it returns flows on."""


@dataclass(frozen=True)
class NodeInfo:
    """One entry of `/nodes`: a node's name, FX op and target, the module it runs in, its inputs,
    and its output's shape and dtype at the model's input size (None where it is no tensor)."""

    name: str
    op: str
    target: str
    module: str
    module_type: str
    inputs: list[str]
    shape: list[Any] | None
    dtype: str | None


@dataclass(frozen=True)
class NodeGraph:
    """A traced model: its GraphModule, its named nodes in graph order, and what `/nodes` lists."""

    module: fx.GraphModule
    nodes: Mapping[str, fx.Node]
    info: tuple[NodeInfo, ...] = ()
    input_size: tuple[int, ...] = ()  # the example the shapes in `info` are for, batch dim included

    @property
    def names(self) -> list[str]:
        return list(self.nodes)


def resolve_nodes(graph: NodeGraph, patterns: Collection[str], limit: int) -> list[str]:
    """Node names given exactly or as fnmatch patterns, in graph order; 422 with the closest names
    for unknown ones, and when more than `limit` are named or matched.

    A module the tracer went into (`layer1`) is no node: the 422 names the node that gives its output.
    """
    for pattern in patterns:
        inside = [name for name in graph.nodes if name.startswith(f"{pattern}.")] if pattern else []
        if pattern not in graph.nodes and inside and not _WILDCARDS.intersection(pattern):
            raise InvalidField(
                f"{pattern!r} is a module, not a node: its output is node {inside[-1]!r}, its nodes match "
                f"'{pattern}.*'; or name it in `layers` (GET /models/{{name}}/nodes lists the nodes)"
            )
    return resolve_names(graph.names, list(patterns), limit, field="nodes", noun="node", listing="nodes")


def run_nodes(graph: NodeGraph, x: Tensor, sites: Collection[str], on_node: OnNode) -> Any:
    """The graph's output for `x`, with `on_node` called on (and replacing) each site's output."""
    unknown = [name for name in sites if name not in graph.nodes]
    if unknown:
        raise InvalidField(f"unknown nodes: {', '.join(repr(n) for n in unknown)}")
    chosen = {graph.nodes[name]: name for name in sites}
    return _Intercepting(graph.module, chosen, on_node).run(x)


def capture_nodes(graph: NodeGraph, names: Collection[str], x: Tensor) -> tuple[Any, Captured, dict[str, list[str]]]:
    """The graph's output for `x`, each named node's output (a detached CPU clone taken as the node
    finishes, so later in-place ops cannot change it) and each node's keys in graph order.

    Keys follow module capture: the node name, with element indices or dict keys for containers
    (`name.0`); non-tensor outputs (sizes, ints) give no key. The side is always `"output"`.
    """
    captured: Captured = {}
    keys: dict[str, list[str]] = {name: [] for name in names}

    def record(name: str, value: Any) -> Any:
        for key, t in flatten_tensors(name, value):
            captured[key] = {"output": detached_copy(t)}
            keys[name].append(key)
        return value

    output = run_nodes(graph, x, names, record)
    on_cpu = {key: {side: t.cpu() for side, t in sides.items()} for key, sides in captured.items()}
    return output, on_cpu, keys


class _Intercepting(fx.Interpreter):
    """Runs a GraphModule node by node; the chosen nodes' outputs pass through `on_node`."""

    def __init__(self, module: fx.GraphModule, chosen: Mapping[fx.Node, str], on_node: OnNode) -> None:
        super().__init__(module, garbage_collect_values=True)
        self.extra_traceback = False  # errors keep their own message (the first line reaches clients)
        self.chosen = chosen
        self.on_node = on_node

    def run_node(self, n: fx.Node) -> Any:
        value = super().run_node(n)
        name = self.chosen.get(n)
        return value if name is None else self.on_node(name, value)


def node_bytes(graph: NodeGraph, names: Collection[str]) -> int:
    """Bytes one sample's outputs of the named nodes take, at the input size the graph was traced at."""
    wanted = set(names)
    total = 0
    for info in graph.info:
        if info.name not in wanted or info.shape is None or info.dtype is None:
            continue
        numel = 1
        for size in info.shape[1:]:
            numel *= int(size)
        total += numel * torch.empty((), dtype=getattr(torch, info.dtype)).element_size()
    return total
