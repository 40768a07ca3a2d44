"""A capture plan: the model's graph with the requested layer inputs and outputs as extra outputs, on ONNX Runtime.

The forward-only capture behind /activations runs the eager module with hooks; a plan runs the
same capture on the prediction path's engine instead. The module tree (a private copy sharing the
weights, so the served module and its lanes are never traced) is traced with FX by a tracer that
records, for every call of a requested module, what the pre-hook and the forward hook would see:
its arguments on entry and its result on exit, keyed exactly as `capture.py` keys them (`name`,
`name#2` for the second call of a reused module, `name.0` for tuple elements, `name.mask` for
keyword tensors). Each recorded value is cloned where the hook would fire, so an in-place op later
in the forward (`ReLU(inplace=True)`, `out += identity`) cannot change it, then becomes an output of
the graph after the model's own output. The graph is exported to ONNX (batch axis dynamic) and kept
only when its outputs on two seeded batches (1 and 3 samples) have the eager hooks' keys, in their
order, with their shapes, and values within the prediction path's tolerance (1e-4).

A plan of functional nodes (`build_node_plan`) does the same from a copy of the node graph: each named
node's output is cloned right after the node and becomes an extra output, checked against
`capture_nodes` on the same probes.

A plan serves inputs of the one sample shape it was built for, in float32 on the CPU. Everything
else, and every capture set whose plan cannot be built (`PlanRefused`, with the reason), is served
by the eager hooks.
"""

from __future__ import annotations

import operator
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, fx, nn

from service.errors import first_line
from service.introspection.capture import Captured, capture_by_layer, tensor_paths
from service.introspection.fx_tracing import TRACING, ThreadLocalTracing
from service.introspection.nodes import NodeGraph, capture_nodes, run_nodes
from service.introspection.tensor_stats import reduce_tensor
from service.registry.lanes import hook_lanes
from service.registry.onnx_path import INPUT, OUTPUT, export, inference_session
from service.registry.probes import TOLERANCE, Placement
from service.specs.vocab import Capture, Reduce

PROBE_BATCHES = (1, 3)
IN_GRAPH = frozenset({Reduce.mean, Reduce.max})  # reductions a plan does inside its graph


@dataclass(frozen=True)
class PlanKey:
    """What a plan captures: these layers (sorted), these sides, from samples of this shape."""

    layers: tuple[str, ...]  # module paths, or the node graph's node names when `nodes`
    capture: Capture
    sample_shape: tuple[int, ...]
    nodes: bool = False
    reduce: Reduce | None = None  # mean or max over the spatial dims, inside the graph (every capture reduced)

    @classmethod
    def of(
        cls,
        layers: Sequence[str],
        capture: Capture,
        sample_shape: Sequence[int],
        nodes: bool = False,
        reduce: Reduce | None = None,
    ) -> PlanKey:
        shape = tuple(int(d) for d in sample_shape)
        return cls(tuple(sorted(set(layers))), Capture(capture), shape, nodes, reduce if reduce in IN_GRAPH else None)

    def describe(self) -> dict[str, object]:
        sites = list(self.layers)
        described: dict[str, object] = {"layers": [], "nodes": sites} if self.nodes else {"layers": sites}
        described |= {"capture": self.capture.value, "sample_shape": list(self.sample_shape)}
        if self.reduce is not None:
            described["reduce"] = self.reduce.value
        return described


@dataclass(frozen=True)
class Site:
    """One extra output of a plan's graph: the capture key and side it answers, and the layer it belongs to."""

    layer: str
    key: str
    side: str


class PlanRefused(Exception):
    """The capture set cannot be planned; the message says why (shown in the model's INFO)."""

    def __init__(self, reason: str, kind: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.kind = kind  # a short label for metrics: untraceable, unsupported, export, mismatch


Capturing = tuple[Any, Captured, dict[str, list[str]]]  # model output, captures, each layer's keys in firing order


class CapturePlan:
    """A built plan: run it with `capture(x)` for `x` it `accepts`; thread-safe (ONNX Runtime sessions are)."""

    def __init__(self, key: PlanKey, sites: Sequence[Site], graph: bytes, wide_threads: int) -> None:
        self.key = key
        self.sites = tuple(sites)
        self.names = [OUTPUT, *(f"capture{i}" for i in range(len(self.sites)))]
        self.narrow = inference_session(graph, 1)
        self.wide = inference_session(graph, wide_threads) if wide_threads > 1 else None
        self.forwards = 0  # batches it served (read for INFO; a lost increment under a race only undercounts)

    def accepts(self, x: Tensor) -> bool:
        return x.device.type == "cpu" and x.dtype == torch.float32 and tuple(x.shape[1:]) == self.key.sample_shape

    def capture(self, x: Tensor) -> Capturing:
        """The model's output, the captures and each layer's keys, as `capture_by_layer` gives them."""
        alone = torch.get_num_threads() > 1  # on the wide runner's thread
        session = self.wide if alone and self.wide is not None else self.narrow
        arrays = session.run(self.names, {INPUT: np.ascontiguousarray(x.detach().numpy())})
        self.forwards += 1
        captured: Captured = {}
        for site, array in zip(self.sites, arrays[1:], strict=True):
            captured.setdefault(site.key, {})[site.side] = torch.from_numpy(array)
        keys = {layer: list(dict.fromkeys(s.key for s in self.sites if s.layer == layer)) for layer in self.key.layers}
        return torch.from_numpy(arrays[0]), captured, keys


def build_plan(module: nn.Module, key: PlanKey, channels_last: bool, wide_threads: int) -> CapturePlan:
    """Trace, export and check a plan for `key` on a private copy of `module`; `PlanRefused` says why not."""
    names = dict(module.named_modules())
    unknown = [layer for layer in key.layers if layer not in names or layer == ""]
    if unknown:
        raise PlanRefused(f"{', '.join(map(repr, unknown))} cannot be an output of the traced graph", "unsupported")
    copies = hook_lanes(module, 1)
    if not copies:
        raise PlanRefused("the module tree cannot be copied to trace it", "unsupported")
    private = copies[0]
    graph, sites = _traced(private, key)

    def hooked(x: Tensor) -> Capturing:
        return capture_by_layer(private, key.layers, key.capture, lambda: private(x))

    placement = Placement(list(key.sample_shape), torch.device("cpu"), torch.float32, channels_last)
    return _checked_plan(key, graph, sites, placement, wide_threads, hooked)


def build_node_plan(graph: NodeGraph, key: PlanKey, channels_last: bool, wide_threads: int) -> CapturePlan:
    """As `build_plan`, for the outputs of the node graph's nodes `key.layers` (what `capture_nodes` reads).

    The graph is run and exported from a private copy of its GraphModule (sharing the weights), so the
    served module's hooks never fire here. Each node's output gets a clone right after the node (an
    in-place op later in the graph cannot change it), one per tensor in it, keyed as `capture_nodes` keys it."""
    unknown = [name for name in key.layers if name not in graph.nodes]
    if unknown:
        raise PlanRefused(f"{', '.join(map(repr, unknown))} is no node of the graph", "unsupported")
    copies = hook_lanes(graph.module, 1)
    if not copies or not isinstance(copies[0], fx.GraphModule):
        raise PlanRefused("the node graph cannot be copied to export it", "unsupported")
    private = copies[0]
    by_name = {node.name: node for node in private.graph.nodes}
    eager = NodeGraph(private, {name: by_name[node.name] for name, node in graph.nodes.items()})
    placement = Placement(list(key.sample_shape), torch.device("cpu"), torch.float32, channels_last)
    probe = placement.probe(PROBE_BATCHES[-1])
    module, sites = _with_node_outputs(eager, key.layers, probe, key.reduce)
    return _checked_plan(key, module, sites, placement, wide_threads, lambda x: capture_nodes(eager, key.layers, x))


def _checked_plan(  # noqa: PLR0917
    key: PlanKey,
    module: nn.Module,
    sites: Sequence[Site],
    placement: Placement,
    wide_threads: int,
    eager: Callable[[Tensor], Capturing],
) -> CapturePlan:
    """`module` (the graph with the sites as extra outputs) on ONNX Runtime, kept only if it answers as `eager`
    (the hooks, or the node graph) does on each probe batch."""
    probe = placement.probe(PROBE_BATCHES[-1])
    try:
        onnx = export(module, probe.contiguous(), [OUTPUT, *(f"capture{i}" for i in range(len(sites)))])
        plan = CapturePlan(key, sites, onnx, wide_threads)
    except Exception as exc:  # an op without an ONNX symbol, a value read into Python
        raise PlanRefused(f"it does not export to ONNX ({first_line(exc)})", "export") from exc
    for batch in PROBE_BATCHES:
        x = placement.probe(batch)
        with torch.inference_mode():
            _check(plan, x, eager(x))
    plan.forwards = 0
    return plan


def _with_node_outputs(
    eager: NodeGraph, names: Sequence[str], probe: Tensor, reduce: Reduce | None
) -> tuple[fx.GraphModule, list[Site]]:
    """A copy of the graph returning (its output, a clone of each tensor in each named node's output), in the order
    the nodes run; the tensors in a node's output (a tuple, a dict) are found by running it once on `probe`."""
    values: dict[str, Any] = {}

    def keep(name: str, value: Any) -> Any:
        values[name] = value
        return value

    with torch.inference_mode():
        run_nodes(eager, probe, names, keep)
    copied = fx.Graph()
    copy_of: dict[fx.Node, fx.Node] = {}
    result = copied.graph_copy(eager.module.graph, copy_of)
    order = {node: i for i, node in enumerate(eager.module.graph.nodes)}
    sites: list[Site] = []
    clones: list[fx.Node] = []
    for name in sorted(names, key=lambda n: order[eager.nodes[n]]):
        node = cursor = copy_of[eager.nodes[name]]
        for key, path, _ in tensor_paths(name, values[name]):
            value = node
            for index in path:
                with copied.inserting_after(cursor):
                    value = cursor = copied.call_function(operator.getitem, (value, index))
            with copied.inserting_after(cursor):
                clone = cursor = copied.call_method("clone", (value,))
            if reduce is not None:
                with copied.inserting_after(cursor):
                    clone = cursor = copied.call_function(reduced, (clone, reduce.value))
            sites.append(Site(name, key, "output"))
            clones.append(clone)
    copied.output((result, *clones))
    return fx.GraphModule(eager.module, copied, type(eager.module).__name__), sites


def _traced(module: nn.Module, key: PlanKey) -> tuple[fx.GraphModule, list[Site]]:
    tracer = _CaptureTracer(set(key.layers), key.capture, key.reduce)
    try:
        with TRACING:
            graph = tracer.trace(module)
    except PlanRefused:
        raise
    except Exception as exc:  # data-dependent control flow, a value read into Python, an untraceable op
        raise PlanRefused(f"FX cannot trace it ({first_line(exc)})", "untraceable") from exc
    missing = sorted(set(key.layers) - {site.layer for site in tracer.sites})
    if missing:
        raise PlanRefused(
            f"{', '.join(map(repr, missing))} never runs as a module call in the traced graph (inside a leaf module, "
            "or not called by the forward)",
            "unsupported",
        )
    (output,) = [node for node in graph.nodes if node.op == "output"]
    output.args = ((output.args[0], *tracer.nodes),)
    return fx.GraphModule(module, graph, type(module).__name__), tracer.sites


class _CaptureTracer(ThreadLocalTracing, fx.Tracer):
    """Records each call of the requested modules: clones of its arguments on entry and of its result on exit."""

    def __init__(self, layers: set[str], capture: Capture, reduce: Reduce | None) -> None:
        super().__init__()
        self.layers = layers
        self.capture = capture
        self.reduce = reduce
        self.ancestors = {layer.rsplit(".", i)[0] for layer in layers for i in range(1, layer.count(".") + 1)}
        self.calls: Counter[str] = Counter()
        self.sites: list[Site] = []
        self.nodes: list[fx.Node] = []

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        """torch.nn's modules are leaves unless a requested layer lies inside one (then it is traced through)."""
        return module_qualified_name not in self.ancestors and super().is_leaf_module(m, module_qualified_name)

    def call_module(
        self, m: nn.Module, forward: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if threading.get_ident() != self._thread:
            return forward(*args, **kwargs)
        name = self.path_of_module(m)
        if name not in self.layers:
            return super().call_module(m, forward, args, kwargs)
        self.calls[name] += 1
        base = name if self.calls[name] == 1 else f"{name}#{self.calls[name]}"
        if self.capture is not Capture.output:
            if len(args) == 1 and not any(_is_value(v) for v in kwargs.values()):
                self._record(name, "input", _flatten(base, args[0]))
            else:
                self._record(name, "input", _flatten(base, args), _flatten(base, kwargs))
        result = super().call_module(m, forward, args, kwargs)
        if self.capture is not Capture.input:
            self._record(name, "output", _flatten(base, result))
        return result

    def _record(self, layer: str, side: str, *groups: Iterator[tuple[str, fx.Proxy]]) -> None:
        for group in groups:
            for key, proxy in group:
                clone = proxy.clone()  # where the hook fires: later in-place ops leave it as the hook saw it
                if self.reduce is not None:
                    clone = self.create_proxy("call_function", reduced, (clone, self.reduce.value), {})
                self.sites.append(Site(layer, key, side))
                self.nodes.append(clone.node)


def _is_value(value: Any) -> bool:
    return isinstance(value, (Tensor, fx.Proxy))


def _flatten(key: str, value: Any) -> Iterator[tuple[str, fx.Proxy]]:
    """`capture.flatten_tensors` over traced values: a proxy stands for a tensor; a real tensor cannot be an output."""
    if isinstance(value, fx.Proxy):
        yield key, value
    elif isinstance(value, Tensor):
        raise PlanRefused(f"{key!r} is a constant tensor of the forward, not a traced value", "unsupported")
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from _flatten(f"{key}.{k}", v)
    elif isinstance(value, (tuple, list)):
        for i, v in enumerate(value):
            yield from _flatten(f"{key}.{i}", v)


def _check(plan: CapturePlan, x: Tensor, eager: Capturing) -> None:
    """The plan's answer on `x` has the `eager` capture's keys, order, sides and shapes, values within TOLERANCE."""
    want_output, want, want_keys = eager
    if plan.key.reduce is not None:
        want = {k: {side: reduce_tensor(t, plan.key.reduce) for side, t in sides.items()} for k, sides in want.items()}
    with torch.inference_mode():
        output, got, got_keys = plan.capture(x)
    if not isinstance(want_output, Tensor):
        raise PlanRefused("its forward does not return one tensor", "unsupported")
    if list(want) != list(got) or want_keys != got_keys:
        raise PlanRefused(
            f"the traced graph's keys {list(got)[:6]} differ from the hooks' {list(want)[:6]}", "mismatch"
        )
    pairs = [(want_output, output)] + [(want[k][side], got[k].get(side)) for k in want for side in want[k]]
    for w, g in pairs:
        if g is None or w.shape != g.shape or not torch.allclose(g, w.float(), rtol=TOLERANCE, atol=TOLERANCE):
            raise PlanRefused(f"ONNX Runtime's captures differ from the hooks' by more than {TOLERANCE:g}", "mismatch")


def reduced(t: Tensor, reduce: str) -> Tensor:
    """A capture reduced inside a plan's graph as `reduce_tensor` reduces it after the hooks: mean or max over the
    dims after the first two. A graph node: the exporter runs it on traced tensors, whose rank is known; a sample
    shape with an empty dim fails the plan's check against the hooks instead of being tested here."""
    if t.ndim <= 2:
        return t
    dims = tuple(range(2, t.ndim))
    return t.mean(dim=dims) if Reduce(reduce) is Reduce.mean else t.amax(dim=dims)
