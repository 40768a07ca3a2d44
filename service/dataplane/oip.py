"""Open Inference Protocol inference on a served model: request bytes in, answer bytes out (no HTTP).

Outputs `output__0`, `output__1`, ... are the model's output tensors in order (a tuple, list
or dict output is flattened). Any other requested name is a layer (a module path from
/layers, or a capture key such as `relu#2` or `block.0`) whose output is recorded by
request-scoped hooks during the same forward (our extension). Without layer outputs the
request joins the executor's dynamic batches; with them it joins the hooked batches of /activations (on a capture
plan once the set repeats).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import torch

from service.codecs.oip_codec import InferCodec
from service.codecs.oip_infer import (
    INPUT_NAME,
    OUTPUT_NAME,
    OUTPUT_PREFIX,
    DecodedInfer,
    TensorInfo,
    check_answer_size,
    datatype_of,
    flatten_outputs,
)
from service.dataplane.base import PlaneBase
from service.dataplane.costs import activations_cost
from service.dataplane.shapes import shapes_at
from service.errors import DeadlineExceeded, InvalidField, NotFound
from service.introspection.layers import closest_names
from service.introspection.shapes import LayerShapes
from service.registry.loaded import LoadedModel
from service.runtime.batching import run_batch
from service.runtime.fleet import ServedModel, Status
from service.runtime.runners.activations import ACTIVATIONS, CaptureRequest, CaptureResult
from service.specs.vocab import Capture

VERSIONS = ["1"]
# What every front of the protocol (REST and gRPC) supports beyond its core
EXTENSIONS = ["binary_tensor_data", "classification", "model_repository", "model_configuration", "statistics"]
PLATFORM = "pytorch"
SMALL_ANSWER = 4096  # elements: answers up to this size are encoded on the event loop
T = TypeVar("T")


@dataclass(frozen=True)
class ModelMetadata:
    name: str
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]


@dataclass
class OutputPlan:
    """Which requested names are model outputs (by index) and which are layer capture keys (by module)."""

    model_outputs: dict[str, int] = field(default_factory=dict)
    layers: dict[str, str] = field(default_factory=dict)  # capture key -> module path


def check_version(name: str, version: str | None) -> None:
    """Every model has one version, "1"; asking for another is a 404."""
    if version is not None and version not in VERSIONS:
        raise NotFound(f"model {name!r} has no version {version!r}; its versions are {VERSIONS}")


class OpenInference(PlaneBase):
    def check_version(self, name: str, version: str | None) -> None:
        check_version(name, version)

    def not_ready(self) -> str | None:
        """Why the server is not ready (a model loading or failed), or None."""
        waiting = [f"{e.spec.name} ({e.status})" for e in self.fleet.entries() if e.status is not Status.ready]
        return f"models not ready: {', '.join(waiting)}" if waiting else None

    def model_not_ready(self, name: str, version: str | None) -> str | None:
        self.check_version(name, version)
        entry = self.fleet.entry(name)
        if entry.status is Status.ready:
            return None
        return f"model {name!r} is {entry.status}" + (f": {entry.error}" if entry.error else "")

    async def model_metadata(self, name: str, version: str | None) -> ModelMetadata:
        self.check_version(name, version)
        served = self.ready(name)
        model = served.model
        inputs = [TensorInfo(INPUT_NAME, datatype_of(model.dtype), [-1, *model.input_size])]
        return ModelMetadata(name, inputs, await output_info(served))

    async def infer(self, name: str, version: str | None, codec: InferCodec[T], timeout_s: float | None = None) -> T:
        """Run one inference request, whichever front it came from; `codec` reads and writes its wire format.

        `timeout_s`: the caller's own deadline (a gRPC deadline), within `request_timeout_s`; past it the
        request is given up (a queued job never runs, a running batch stops if nobody else waits) and 504s.
        """
        self.check_version(name, version)
        served = self.ready(name)
        if timeout_s is None:
            return await self._infer_admitted(served, codec)
        if timeout_s <= 0:
            raise DeadlineExceeded("the request's deadline had passed before it reached the model")
        try:
            async with asyncio.timeout(timeout_s):
                return await self._infer_admitted(served, codec)
        except TimeoutError:
            raise DeadlineExceeded(
                f"the request's own deadline ({timeout_s:.3g} s left when it arrived) passed before its answer; "
                "it was given up: allow more time, send fewer inputs, or retry when the model is less busy"
            ) from None

    async def _infer_admitted(self, served: ServedModel, codec: InferCodec[T]) -> T:
        model = served.model
        await codec.receive()
        decoded = await self.off_loop(codec.decode, model, self.settings)
        batch = decoded.batch
        shapes = await shapes_at(served, tuple(int(s) for s in batch.shape[1:]), self.decode_pool)
        plan = plan_outputs(model, [o.name for o in decoded.outputs or []])
        check_answer_size(decoded, _expected_outputs(shapes, plan, int(batch.shape[0])), self.settings)
        layers = sorted(set(plan.layers.values()))
        estimate = activations_cost(batch, shapes, CaptureRequest(tuple(layers), Capture.output), "safetensors")
        async with self.budget.reserve(estimate.cost, "send fewer or smaller inputs, or ask for fewer layer outputs"):
            tensors = await _infer(served, decoded)
            if sum(t.numel() for t in tensors.values()) > SMALL_ANSWER:
                return await self.off_loop(codec.encode, model, decoded, tensors, self.settings)
            return codec.encode(model, decoded, tensors, self.settings)


def _expected_outputs(shapes: LayerShapes, plan: OutputPlan, n: int) -> dict[str, tuple[tuple[int, ...], int]]:
    """Each output the answer may carry, as (shape for `n` samples, item size): the model's outputs (`output__i`,
    its root module's outputs in order) and the requested layer keys, from the layer shapes at the input's size."""
    expected = {f"{OUTPUT_PREFIX}{i}": t for i, t in enumerate(shapes.outputs.get("", []))}
    expected |= {key: shapes.outputs[key][0] for key in plan.layers if shapes.outputs.get(key)}
    return {name: ((n, t.per_sample_numel), t.itemsize) for name, t in expected.items()}


async def output_info(served: ServedModel) -> list[TensorInfo]:
    """Output names, datatypes and shapes, from one forward of a zero batch at the model's input size (cached)."""
    model = served.model
    key: tuple[object, ...] = ("oip-outputs",)
    cached = model.summary_cache.get(key)
    if isinstance(cached, list):
        return cached
    probe = torch.zeros([1, *model.input_size], dtype=model.dtype)
    # alone on the eager module, not as a prediction: the model's statistics count only the requests it answers
    outputs = await served.executor.run_exclusive(lambda: flatten_outputs(run_batch(model, [probe])[0]))
    infos = [
        TensorInfo(f"{OUTPUT_PREFIX}{i}", datatype_of(t.dtype), [-1, *t.shape[1:]] if t.ndim else [])
        for i, t in enumerate(outputs)
    ]
    model.summary_cache[key] = infos
    return infos


async def _infer(served: ServedModel, decoded: DecodedInfer) -> dict[str, torch.Tensor]:
    """Run the batch once; the requested outputs by name (CPU tensors, batch first), or all model outputs."""
    model, batch = served.model, decoded.batch
    names = None if decoded.outputs is None else [o.name for o in decoded.outputs]
    plan = plan_outputs(model, names or [])
    captured: dict[str, dict[str, torch.Tensor]] = {}
    if not plan.layers:
        outputs: list[torch.Tensor] = await served.executor.predict(batch, flatten_outputs)
    else:
        request = CaptureRequest(tuple(sorted(set(plan.layers.values()))), Capture.output)
        found: CaptureResult = await served.executor.submit(ACTIVATIONS, batch, request)
        outputs, captured = flatten_outputs(found.output), found.captured
    if names is None:
        return {f"{OUTPUT_PREFIX}{i}": t for i, t in enumerate(outputs)}
    picked: dict[str, torch.Tensor] = {}
    for name, index in plan.model_outputs.items():
        if index >= len(outputs):
            raise InvalidField(
                f"unknown output {name!r}: {model.name} has outputs output__0..output__{len(outputs) - 1}"
            )
        picked[name] = outputs[index]
    for key, module in plan.layers.items():
        picked[key] = _captured_output(key, module, captured)
    return {name: picked[name] for name in names}


def plan_outputs(model: LoadedModel, names: Sequence[str]) -> OutputPlan:
    """Sort requested names into model outputs and layer keys; unknown names are a 422 with the closest ones."""
    modules = model.layer_names
    known = set(modules)
    plan = OutputPlan()
    for name in names:
        match = OUTPUT_NAME.match(name)
        if match:
            plan.model_outputs[name] = int(match.group(1))
            continue
        module = _module_of(name, known)
        if module is None:
            close = closest_names(name, [f"{OUTPUT_PREFIX}0", *modules])
            hint = f"; closest: {', '.join(repr(c) for c in close)}" if close else ""
            raise InvalidField(
                f"unknown output {name!r}: ask for output__0.. or a layer of {model.name}{hint} "
                "(GET /models/{name}/layers lists them)"
            )
        plan.layers[name] = module
    return plan


def _module_of(key: str, modules: set[str]) -> str | None:
    """The module a capture key belongs to: `a.b` itself, `a.b#2` (its 2nd call), `a.b.0` (element 0 of its output)."""
    head = key
    while True:
        stem = head.split("#", 1)[0]
        if stem in modules:
            return stem
        if "." not in head:
            return None
        head = head.rsplit(".", 1)[0]


def _captured_output(key: str, module: str, captured: Mapping[str, Mapping[str, torch.Tensor]]) -> torch.Tensor:
    found = captured.get(key, {}).get("output")
    if found is not None:
        return found
    mine = [k for k in captured if k == module or k.startswith((f"{module}.", f"{module}#"))]
    if not mine:
        raise InvalidField(f"layer {module!r} did not run in this forward, so {key!r} has no output")
    raise InvalidField(f"no output {key!r}; layer {module!r} gives {', '.join(repr(k) for k in mine[:16])}")
