"""Activations of several requests from one hooked forward over their concatenated inputs.

Hooks go on the union of the requests' layers (capturing both sides when their captures
differ); each request then takes its own rows, layers, sides and `name#k` calls, and its own
reduction, so its answer equals the one it would get alone (up to the kernels' rounding
for another batch size).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from service.introspection.capture import Captured, capture_by_layer
from service.introspection.tensor_stats import reduce_tensor
from service.registry.loaded import LoadedModel
from service.runtime.batching import forward_checked, split_output, to_cpu, to_device
from service.runtime.runners.base import NotSplittable, Runner, concatenated, offsets, rows
from service.specs.vocab import Capture, Reduce

_SIDES = {Capture.output: ("output",), Capture.input: ("input",), Capture.both: ("input", "output")}


@dataclass(frozen=True)
class CaptureRequest:
    layers: tuple[str, ...]
    capture: Capture = Capture.output
    reduce: Reduce | None = None


@dataclass
class CaptureResult:
    captured: Captured
    output: Any  # this request's rows of the model's output, on the CPU


class ActivationsRunner(Runner[CaptureRequest]):
    name = "activations"
    hooked = True

    def key(self, request: CaptureRequest) -> Hashable:
        return ()

    def run(self, model: LoadedModel, inputs: Sequence[torch.Tensor], requests: Sequence[CaptureRequest]) -> list[Any]:
        layers = list(dict.fromkeys(layer for request in requests for layer in request.layers))
        modes = {request.capture for request in requests}
        mode = modes.pop() if len(modes) == 1 else Capture.both
        x = to_device(concatenated(inputs), model)

        def forward() -> Any:
            with torch.inference_mode():
                return forward_checked(model, x)  # a sample shape the model cannot run is a 422, as in /predict

        output, captured, keys = capture_by_layer(model.module, layers, mode, forward)
        bounds = offsets(inputs)
        total = bounds[-1][1]
        outputs = [to_cpu(output)] if len(inputs) == 1 else split_output(to_cpu(output), [b - a for a, b in bounds])
        layer_of = {key: layer for layer, found in keys.items() for key in found}
        answers: list[Any] = []
        for request, span, out in zip(requests, bounds, outputs, strict=True):
            mine = set(request.layers)
            sides = _SIDES[request.capture]
            own: Captured = {}
            for key, found in captured.items():
                if layer_of[key] not in mine:
                    continue
                picked = {
                    side: t if len(inputs) == 1 else rows(t, span, total) for side, t in found.items() if side in sides
                }
                if picked:
                    own[key] = {side: reduce_tensor(t, request.reduce) for side, t in picked.items()}
            answers.append(CaptureResult(own, out))
        return answers


ACTIVATIONS = ActivationsRunner()
__all__ = ["ACTIVATIONS", "ActivationsRunner", "CaptureRequest", "CaptureResult", "NotSplittable"]
