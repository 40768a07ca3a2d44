"""One forward for several requests: concatenate, run, split the output back per request."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from service.errors import InvalidField, first_line
from service.introspection.capture import capture_by_layer
from service.introspection.nodes import NodeGraph, capture_nodes
from service.registry.capture_graph import CapturePlan, Capturing
from service.registry.loaded import LoadedModel
from service.runtime.statistics import Phase, phase
from service.specs.vocab import Capture


def run_batch(model: LoadedModel, inputs: Sequence[torch.Tensor], module: nn.Module | None = None) -> list[Any]:
    """Forward the concatenation of `inputs` under inference_mode (on `module`, default the eager
    module); one output slice per input."""
    sizes = [int(x.shape[0]) for x in inputs]
    with torch.inference_mode():
        batch = inputs[0] if len(inputs) == 1 else torch.cat(list(inputs))
        batch = to_device(batch, model)
        output = forward_checked(model, batch, module)
        if len(inputs) == 1:
            return [to_cpu(output)]
        return [to_cpu(part) for part in split_output(output, sizes)]


@contextmanager
def foreign_shape_errors(model: LoadedModel, batch: torch.Tensor) -> Iterator[None]:
    """A forward that fails on a sample shape other than the model's own is the client's mistake (422).

    Wraps any job body that runs the model, so no job needs an extra forward just to check.
    """
    try:
        yield
    except torch.OutOfMemoryError:
        raise
    except (RuntimeError, ValueError, IndexError, AssertionError) as exc:  # timm checks input sizes with asserts
        sample = list(batch.shape[1:])
        if sample == list(model.input_size):
            raise
        raise foreign_shape(model, sample, first_line(exc)) from None


def foreign_shape(model: LoadedModel, sample: list[int], reason: str) -> InvalidField:
    """The 422 for samples of a shape the model cannot run, with its reason."""
    return InvalidField(
        f"{model.name} cannot run on samples of shape {sample} (its input size is {model.input_size}): {reason}"
    )


def forward_checked(model: LoadedModel, batch: torch.Tensor, module: nn.Module | None = None) -> Any:
    """`module(batch)` (default the eager module) with `foreign_shape_errors`."""
    with foreign_shape_errors(model, batch):
        return (module if module is not None else model.module)(batch)


def to_device(x: torch.Tensor, model: LoadedModel) -> torch.Tensor:
    """Move a CPU batch to the model: pinned + non_blocking on CUDA; cast floating inputs to the model dtype;
    NHWC when the model runs channels_last. Counted as the batch's compute_input."""
    with phase(Phase.input):
        return _to_device(x, model)


def _to_device(x: torch.Tensor, model: LoadedModel) -> torch.Tensor:
    device = model.device
    if device.type == "cuda" and x.device.type == "cpu" and not x.is_pinned():  # GPU-decoded JPEGs are there already
        x = x.pin_memory()
    x = x.to(device, non_blocking=device.type == "cuda")
    if x.is_floating_point() and x.dtype != model.dtype:
        x = x.to(model.dtype)
    if model.channels_last and x.ndim == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    return x


def split_output(output: Any, sizes: list[int]) -> list[Any]:
    """Split a tensor / list / tuple / dict output along dim 0 into per-request parts."""
    if isinstance(output, torch.Tensor):
        return list(torch.split(output, sizes))
    if isinstance(output, (list, tuple)):
        parts = [split_output(o, sizes) for o in output]
        return [type(output)(p[i] for p in parts) for i in range(len(sizes))]
    if isinstance(output, dict):
        split = {k: split_output(v, sizes) for k, v in output.items()}
        return [{k: v[i] for k, v in split.items()} for i in range(len(sizes))]
    return [output for _ in sizes]


def to_cpu(output: Any) -> Any:
    """The output on the CPU, detached (counted as the batch's compute_output)."""
    with phase(Phase.output):
        return _to_cpu(output)


def _to_cpu(output: Any) -> Any:
    if isinstance(output, torch.Tensor):
        return output.detach().to("cpu") if output.device.type != "cpu" else output.detach()
    if isinstance(output, (list, tuple)):
        return type(output)(_to_cpu(o) for o in output)
    if isinstance(output, dict):
        return {k: _to_cpu(v) for k, v in output.items()}
    return output


def capture_layers(
    model: LoadedModel, layers: list[str], mode: Capture, x: torch.Tensor, plan: CapturePlan | None
) -> Capturing:
    """The layers' captures on the model's capture plan for them when there is one, else by hooks on this lane."""
    if plan is not None:
        with torch.inference_mode():
            return plan.capture(x)

    def forward() -> Any:
        with torch.inference_mode():
            return forward_checked(model, x)  # a sample shape the model cannot run is a 422, as in /predict

    return capture_by_layer(model.module, layers, mode, forward)


def capture_at_nodes(
    model: LoadedModel, graph: NodeGraph, nodes: list[str], x: torch.Tensor, plan: CapturePlan | None
) -> Capturing:
    """The nodes' outputs on the model's capture plan for them when there is one, else by a run of the node graph."""
    with torch.inference_mode(), foreign_shape_errors(model, x):
        return plan.capture(x) if plan is not None else capture_nodes(graph, nodes, x)
