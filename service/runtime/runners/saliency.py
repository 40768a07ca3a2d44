"""Attribution maps of several requests of one method in one batch: each row with its own target and parameters."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from service.config import Settings
from service.introspection.attribution import MethodParams, method_named
from service.introspection.attribution.run import attribute_batch
from service.introspection.targets import TargetSpec, resolve_targets
from service.registry.loaded import LoadedModel
from service.runtime.batching import foreign_shape_errors, to_device
from service.runtime.runners.base import Runner, concatenated, offsets

# prediction paths that perturbation methods' forwards may take: any batch size runs at once on them (a compiled
# copy would compile again for each new chunk size)
PLAIN_PATHS = frozenset({"onnxruntime", "fused"})


def plain_copy(model: LoadedModel) -> nn.Module | None:
    """The copy perturbation methods' forwards run on: the prediction path's, when it takes any batch size."""
    return model.fast if model.prediction_path in PLAIN_PATHS else None


@dataclass(frozen=True)
class SaliencyRequest:
    params: MethodParams
    target: TargetSpec
    rows: int | None = None  # rows one forward may see, chosen to fit the memory limit (None: the method's setting)


class SaliencyRunner(Runner[SaliencyRequest]):
    """Requests share a batch when their method and its batch key agree (Grad-CAM's layer, IG's steps)."""

    name = "saliency"
    hooked = True

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def key(self, request: SaliencyRequest) -> Hashable:
        method = method_named(request.params.method)
        return method.name, method.batch_key(request.params)

    def short(self, request: SaliencyRequest) -> bool:
        """Methods that run their own forwards (noise tunnels, path integrals) are long: never every core."""
        return not method_named(request.params.method).many_forwards

    def run(self, model: LoadedModel, inputs: Sequence[torch.Tensor], requests: Sequence[SaliencyRequest]) -> list[Any]:
        bounds = offsets(inputs)

        def resolve(logits: torch.Tensor) -> list[int]:
            targets: list[int] = []
            for request, (start, stop) in zip(requests, bounds, strict=True):
                targets += resolve_targets(request.target, logits[start:stop], model.labels)
            return targets

        x = to_device(concatenated(inputs), model)
        params = [
            request.params for request, (start, stop) in zip(requests, bounds, strict=True) for _ in range(start, stop)
        ]
        chosen = [request.rows for request in requests if request.rows is not None]
        with foreign_shape_errors(model, x):
            items = attribute_batch(
                model.module,
                x,
                params,
                resolve,
                self.settings,
                rows_per_forward=min(chosen, default=None),
                plain=plain_copy(model),
            )
        on_cpu = [replace(item, attribution=item.attribution.cpu(), heatmap=item.heatmap.cpu()) for item in items]
        return [on_cpu[start:stop] for start, stop in bounds]
