"""Open Inference Protocol inference on a served model: request tensors in, named outputs out (no HTTP).

Outputs `output__0`, `output__1`, ... are the model's output tensors in order (a tuple, list
or dict output is flattened). Any other requested name is a layer (a module path from
/layers, or a capture key such as `relu#2` or `block.0`) whose output is recorded by
request-scoped hooks during the same forward (our extension). Without layer outputs the
request joins the executor's dynamic batches; with them it runs exclusively.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from service.codecs.images import image_to_tensor
from service.codecs.oip import Datatype, bf16_bits_to_float32
from service.dtypes import BY_TORCH
from service.errors import InvalidField, TooLarge
from service.introspection.capture import capture_activations
from service.introspection.layers import closest_names
from service.registry.loaded import LoadedModel
from service.runtime.batching import run_batch
from service.runtime.executor import ModelExecutor
from service.specs.vocab import Capture

INPUT_NAME = "input__0"
OUTPUT_PREFIX = "output__"
PLATFORM = "pytorch"
_OUTPUT_NAME = re.compile(r"^output__(\d+)$")


@dataclass(frozen=True)
class TensorInfo:
    """A model input or output as metadata lists it; -1 is the batch dimension."""

    name: str
    datatype: Datatype
    shape: list[int]


@dataclass(frozen=True)
class OutputRequest:
    name: str
    binary: bool = False
    classification: int = 0  # top-k strings instead of the tensor; 0 = off


@dataclass
class OutputPlan:
    """Which requested names are model outputs (by index) and which are layer capture keys (by module)."""

    model_outputs: dict[str, int] = field(default_factory=dict)
    layers: dict[str, str] = field(default_factory=dict)  # capture key -> module path


def is_model_output(name: str) -> bool:
    return _OUTPUT_NAME.match(name) is not None


def datatype_of(dtype: torch.dtype) -> Datatype:
    info = BY_TORCH.get(dtype)
    if info is None or info.oip is None:
        raise InvalidField(f"tensors of dtype {dtype} have no Open Inference Protocol datatype")
    return Datatype(info.oip)


def flatten_outputs(output: Any) -> list[torch.Tensor]:
    """The model's output tensors in order: a tensor, or the tensors of a (nested) tuple, list or dict."""
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, Mapping):
        return [t for v in output.values() for t in flatten_outputs(v)]
    if isinstance(output, (list, tuple)):
        return [t for v in output for t in flatten_outputs(v)]
    return []


def input_info(model: LoadedModel) -> TensorInfo:
    return TensorInfo(INPUT_NAME, datatype_of(model.dtype), [-1, *model.input_size])


async def output_info(model: LoadedModel, executor: ModelExecutor) -> list[TensorInfo]:
    """Output names, datatypes and shapes, from one forward of a zero batch at the model's input size (cached)."""
    key: tuple[object, ...] = ("oip-outputs",)
    cached = model.summary_cache.get(key)
    if isinstance(cached, list):
        return cached
    probe = torch.zeros([1, *model.input_size], dtype=model.dtype)
    outputs = await executor.predict(probe, flatten_outputs)
    infos = [
        TensorInfo(f"{OUTPUT_PREFIX}{i}", datatype_of(t.dtype), [-1, *t.shape[1:]] if t.ndim else [])
        for i, t in enumerate(outputs)
    ]
    model.summary_cache[key] = infos
    return infos


def tensor_batch(array: np.ndarray[Any, Any], datatype: Datatype, model: LoadedModel, max_inputs: int) -> torch.Tensor:
    """A numeric input as the model's batch: rank and channels checked, other sizes fed as they are."""
    expected = [-1, *model.input_size]
    shape = list(array.shape)
    if len(shape) != len(expected) or shape[1] != expected[1]:
        raise InvalidField(f"{INPUT_NAME} has shape {shape}; {model.name} takes {expected} (N samples first)")
    _check_count(shape[0], max_inputs)
    if datatype is Datatype.BF16:
        array = bf16_bits_to_float32(array)
    if array.dtype.kind in "fc":
        tensor = torch.from_numpy(np.ascontiguousarray(array))
        if not bool(torch.isfinite(tensor).all()):
            raise InvalidField(f"{INPUT_NAME} holds NaN or infinite values")
        return tensor.to(torch.bfloat16) if datatype is Datatype.BF16 else tensor
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))


def image_batch(array: np.ndarray[Any, Any], model: LoadedModel, max_inputs: int, max_pixels: int) -> torch.Tensor:
    """A BYTES input of shape [N] or [N, 1]: N encoded images, preprocessed like /predict's."""
    if array.ndim not in (1, 2) or (array.ndim == 2 and array.shape[1] != 1):
        raise InvalidField(f"BYTES {INPUT_NAME} holds encoded images: shape [N] or [N, 1], not {list(array.shape)}")
    _check_count(array.shape[0], max_inputs)
    samples = [
        image_to_tensor(bytes(data), model.preprocess, model.channels, max_pixels, f"{INPUT_NAME}[{i}]")
        for i, data in enumerate(array.reshape(-1))
    ]
    shapes = {tuple(s.shape) for s in samples}
    if len(shapes) > 1:
        raise InvalidField(f"images preprocess to different shapes {sorted(shapes)}; send one request per shape")
    return torch.stack(samples)


def _check_count(n: int, max_inputs: int) -> None:
    if n < 1:
        raise InvalidField(f"{INPUT_NAME} has no samples (batch dimension 0)")
    if n > max_inputs:
        raise TooLarge(f"{n} samples, over the limit of {max_inputs} per request (max_inputs)")


def plan_outputs(model: LoadedModel, names: Sequence[str]) -> OutputPlan:
    """Sort requested names into model outputs and layer keys; unknown names are a 422 with the closest ones."""
    modules = [name for name, _ in model.module.named_modules()]
    known = set(modules)
    plan = OutputPlan()
    for name in names:
        match = _OUTPUT_NAME.match(name)
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


async def infer(
    model: LoadedModel, executor: ModelExecutor, batch: torch.Tensor, names: Sequence[str] | None
) -> dict[str, torch.Tensor]:
    """Run `batch` once; the requested outputs by name (CPU tensors, batch first), or all model outputs for None."""
    plan = plan_outputs(model, names or [])
    captured: dict[str, dict[str, torch.Tensor]] = {}
    if not plan.layers:
        outputs: list[torch.Tensor] = await executor.predict(batch, flatten_outputs)
    else:
        layers = sorted(set(plan.layers.values()))

        def job() -> tuple[list[torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
            result, found = capture_activations(
                model.module, layers, Capture.output, lambda: run_batch(model, [batch])[0]
            )
            return flatten_outputs(result), found

        outputs, captured = await executor.run_exclusive(job)
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


def _captured_output(key: str, module: str, captured: Mapping[str, Mapping[str, torch.Tensor]]) -> torch.Tensor:
    found = captured.get(key, {}).get("output")
    if found is not None:
        return found
    mine = [k for k in captured if k == module or k.startswith((f"{module}.", f"{module}#"))]
    if not mine:
        raise InvalidField(f"layer {module!r} did not run in this forward, so {key!r} has no output")
    raise InvalidField(f"no output {key!r}; layer {module!r} gives {', '.join(repr(k) for k in mine[:16])}")


def classify(scores: torch.Tensor, k: int, label: Callable[[int], str]) -> np.ndarray[Any, Any]:
    """Triton's classification extension: per sample, the top-k values as "<value>:<index>:<label>" BYTES.

    Values are printed like C++ `std::to_string` (`%f`), highest first (ties: lower index first).
    """
    if scores.ndim == 0:
        raise InvalidField("classification needs a batch of scores, not a scalar output")
    flat = scores.detach().reshape(scores.shape[0], -1).to(torch.float64)
    k = min(k, flat.shape[1])
    values, indices = torch.sort(flat, dim=1, descending=True, stable=True)
    rows = [
        [f"{v:f}:{i}:{label(i)}".encode() for v, i in zip(vs[:k], idx[:k], strict=True)]
        for vs, idx in zip(values.tolist(), indices.tolist(), strict=True)
    ]
    out = np.empty((flat.shape[0], k), dtype=object)
    for r, row in enumerate(rows):
        out[r, :] = row
    return out


def as_array(tensor: torch.Tensor) -> tuple[Datatype, np.ndarray[Any, Any]]:
    """A CPU tensor as (datatype, array); BF16 as its bit patterns."""
    datatype = datatype_of(tensor.dtype)
    t = tensor.detach().cpu().contiguous()
    if datatype is Datatype.BF16:
        return datatype, t.view(torch.int16).numpy().view(np.uint16)
    return datatype, t.numpy()
