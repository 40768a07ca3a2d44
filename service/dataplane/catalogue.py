"""What the served models are and hold: INFO, layers, torchinfo summary, state dict, optimizer; admin add/remove."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from service.dataplane.base import PlaneBase
from service.dataplane.info import model_detail, model_info
from service.errors import NotFound
from service.introspection.layers import layer_tree
from service.introspection.optimizer import optimizer_metadata, param_names_for
from service.introspection.state_dict import get_tensor, state_dict_entries
from service.introspection.summary import summarize
from service.registry.paths import confine_kwargs
from service.runtime.fleet import ServedModel, Status
from service.schemas.models import ModelDetail, ModelInfo
from service.specs.model import ModelSpec


class Catalogue(PlaneBase):
    def models(self) -> list[ModelInfo]:
        return [model_info(e) for e in self.fleet.entries()]

    def model(self, name: str) -> ModelDetail:
        return model_detail(self.fleet.entry(name))

    def unready_models(self) -> dict[str, dict[str, str]]:
        """The models that are loading or failed: their status, and the error of a failed one."""
        return {
            e.spec.name: {"status": e.status.value, **({"error": e.error} if e.error else {})}
            for e in self.fleet.entries()
            if e.status is not Status.ready
        }

    def add_model(self, spec: ModelSpec) -> ModelInfo:
        """Register `spec` and start loading it in the background (202: poll its INFO).

        A kwarg naming a file outside the model dir is refused now (403), before anything loads.
        """
        confine_kwargs(self.settings.model_dir, spec.kwargs)
        return model_info(self.fleet.add(spec))

    async def remove_model(self, name: str) -> ModelInfo:
        """Unload `name`, finish its queued jobs and release its memory; its INFO as it was."""
        info = model_info(self.fleet.entry(name))
        await self.fleet.remove(name)
        return info

    async def layers(self, served: ServedModel) -> list[dict[str, Any]]:
        module = served.model.module
        return await served.executor.run_shared(lambda: [dataclasses.asdict(node) for node in layer_tree(module)])

    async def summary(self, served: ServedModel, input_size: list[int] | None, depth: int) -> dict[str, Any]:
        """torchinfo's summary at `input_size` (batch included; default 1 + the model's), cached per size and depth."""
        model = served.model
        size = input_size or [1, *model.input_size]
        key = ("summary", tuple(size), depth, str(model.dtype))
        cached = model.summary_cache.get(key)
        if cached is None:  # torchinfo registers hooks: the model is held exclusively
            cached = await served.executor.run_exclusive(
                lambda: summarize(model.module, size, depth, model.device, model.dtype)
            )
            model.summary_cache[key] = cached
        summary: dict[str, Any] = cached  # type: ignore[assignment]
        return summary

    async def state_dict(self, served: ServedModel, stats: bool) -> dict[str, Any]:
        module = served.model.module
        return await served.executor.run_shared(lambda: state_dict_entries(module, stats))

    async def tensor(self, served: ServedModel, key: str) -> torch.Tensor:
        """One state-dict entry (a CPU tensor), for download."""
        module = served.model.module
        return await served.executor.run_shared(lambda: get_tensor(module, key))

    async def optimizer(self, served: ServedModel) -> dict[str, Any]:
        model = served.model
        opt = model.optimizer
        if opt is None:
            raise NotFound(
                f"model {model.name!r} has no optimizer (configure [models.optimizer] or load a training checkpoint)"
            )

        def describe() -> dict[str, Any]:
            return optimizer_metadata(type(opt).__name__, opt.state_dict(), param_names_for(model.module, opt))

        return await served.executor.run_shared(describe)
