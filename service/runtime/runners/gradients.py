"""Gradients of several requests from one forward and one backward over their concatenated inputs.

The score is the sum over every row of its own target logit (each request resolves its own
targets from its own rows), so in eval mode each row's gradient is that row's alone. Autograd
runs from the input only when some request asks for input gradients, else from the earliest
requested layer on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from service.errors import HookserveError
from service.introspection.gradients import INPUT_KEY, GradientResult, check_ran, layer_gradients
from service.introspection.targets import TargetSpec, resolve_targets
from service.registry.loaded import LoadedModel
from service.runtime.batching import foreign_shape_errors, to_device
from service.runtime.runners.base import Runner, concatenated, offsets, rows


@dataclass(frozen=True)
class GradientsRequest:
    layers: tuple[str, ...]
    target: TargetSpec
    include_input: bool


class GradientsRunner(Runner[GradientsRequest]):
    name = "gradients"
    hooked = True

    def run(
        self, model: LoadedModel, inputs: Sequence[torch.Tensor], requests: Sequence[GradientsRequest]
    ) -> list[Any]:
        layers = list(dict.fromkeys(layer for request in requests for layer in request.layers))
        bounds = offsets(inputs)
        total = bounds[-1][1]

        def resolve(logits: torch.Tensor) -> list[int]:
            targets: list[int] = []
            for request, (start, stop) in zip(requests, bounds, strict=True):
                targets += resolve_targets(request.target, logits[start:stop], model.labels)
            return targets

        x = to_device(concatenated(inputs), model)
        with foreign_shape_errors(model, x):
            found = layer_gradients(
                model.module, x, layers, resolve, include_input=any(r.include_input for r in requests)
            )
        answers: list[Any] = []
        for request, span in zip(requests, bounds, strict=True):
            try:
                for layer in request.layers:
                    check_ran(layer, found.keys[layer])
            except HookserveError as exc:
                answers.append(exc)
                continue
            mine = {key for layer in request.layers for key in found.keys[layer]}
            keys = [key for key in found.gradients if key in mine]
            if request.include_input:
                keys.append(INPUT_KEY)
            answers.append(
                GradientResult(
                    targets=found.targets[span[0] : span[1]],
                    scores=[float(s) for s in found.scores[span[0] : span[1]].float().tolist()],
                    gradients={key: rows(found.gradients[key], span, total).cpu() for key in keys},
                )
            )
        return answers


GRADIENTS = GradientsRunner()
