"""The Open Inference Protocol repository extension over the fleet: index, load, unload.

Unloading (here or with DELETE /models/{name}) forgets a model's executor and memory; the
fleet remembers its spec, so a later load brings the same model back, as Triton's
repository does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

import orjson
from pydantic import ValidationError

from service.dataplane.base import PlaneBase
from service.errors import Conflict, InvalidField, NotFound
from service.registry.paths import confine_kwargs
from service.runtime.fleet import Entry, Fleet, Status
from service.specs.model import ModelSpec


class RepositoryState(StrEnum):
    READY = "READY"
    LOADING = "LOADING"
    UNAVAILABLE = "UNAVAILABLE"


def repository_index(registry: Fleet, ready_only: bool = False) -> list[dict[str, Any]]:
    """Every registered or unloaded model with its state and the reason it is not ready, sorted by name."""
    rows: dict[str, dict[str, Any]] = {}
    for name in registry.retired:
        rows[name] = {"name": name, "version": "1", "state": RepositoryState.UNAVAILABLE, "reason": "unloaded"}
    for entry in registry.entries():
        state, reason = _state(entry)
        rows[entry.spec.name] = {"name": entry.spec.name, "version": "1", "state": state, "reason": reason}
    listed = [rows[name] for name in sorted(rows)]
    return [row for row in listed if row["state"] is RepositoryState.READY] if ready_only else listed


def _state(entry: Entry) -> tuple[RepositoryState, str]:
    if entry.status is Status.ready:
        return RepositoryState.READY, ""
    if entry.status is Status.loading:
        return RepositoryState.LOADING, "loading"
    return RepositoryState.UNAVAILABLE, entry.error or "failed to load"


async def load(registry: Fleet, name: str, config: str | None = None) -> Entry:
    """Load `name` and wait until it is ready: a new spec from `config` (JSON), else the one it had.

    Already ready or loading: waits for it. A failed model is loaded again. A load that fails is a 409.
    """
    spec = _spec_from_config(name, config) if config is not None else None
    if spec is not None:
        confine_kwargs(registry.settings.model_dir, spec.kwargs)  # 403 now, as POST /models does
    if name in registry:
        entry = registry.entry(name)
        if entry.status is Status.failed:
            entry = registry.add(spec, root=None) if spec is not None else registry.add(entry.spec, root=entry.root)
        elif spec is not None:
            raise Conflict(f"model {name!r} is {entry.status}; unload it before loading a new config")
    elif spec is not None:
        entry = registry.add(spec, root=None)
    elif name in registry.retired:
        retired = registry.retired[name]
        entry = registry.add(retired.spec, root=retired.root)
    else:
        raise NotFound(f"no model named {name!r}; give parameters.config (a model spec as JSON) to load a new one")
    if entry.task is not None:
        await asyncio.shield(entry.task)
    if entry.status is not Status.ready:
        raise Conflict(f"model {name!r} failed to load: {entry.error or entry.status}")
    return entry


def _spec_from_config(name: str, config: str) -> ModelSpec:
    try:
        data = orjson.loads(config)
    except orjson.JSONDecodeError:
        raise InvalidField("parameters.config must be a model spec as a JSON string") from None
    if not isinstance(data, dict):
        raise InvalidField("parameters.config must be a JSON object (the fields of POST /models)")
    if data.setdefault("name", name) != name:
        raise InvalidField(f"parameters.config names {data['name']!r}, but the path names {name!r}")
    try:
        return ModelSpec.model_validate(data)
    except ValidationError as exc:
        problems = (f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors(include_url=False))
        raise InvalidField("parameters.config: " + "; ".join(problems)) from None


async def unload(registry: Fleet, name: str) -> None:
    """Release the model and remember its spec; unloading an unloaded model is a no-op."""
    if name not in registry:
        if name in registry.retired:
            return
        raise NotFound(f"no model named {name!r}; POST /v2/repository/index lists them")
    await registry.remove(name)


class Repository(PlaneBase):
    def repository_index(self, ready_only: bool) -> list[dict[str, Any]]:
        return repository_index(self.fleet, ready_only)

    async def repository_load(self, name: str, parameters: Mapping[str, Any] | None) -> None:
        """Load `name` (again), from `parameters.config` (a model spec as a JSON string) when given."""
        params = parameters or {}
        if any(key.startswith("file:") for key in params):
            raise InvalidField("model files in the request are not supported; give parameters.config (a model spec)")
        config = params.get("config")
        if config is not None and not isinstance(config, str):
            raise InvalidField("parameters.config must be a string holding a JSON model spec")
        await load(self.fleet, name, config)

    async def repository_unload(self, name: str) -> None:
        await unload(self.fleet, name)
