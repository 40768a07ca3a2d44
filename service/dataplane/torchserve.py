"""What TorchServe's APIs ask of the served models: predictions and explanations as its image classifier
gives them, and a management API over the fleet, with `.mar` archives registered from the model dir.

Predictions are /predict's (top 5, softmax) and explanations /saliency's Integrated Gradients with
TorchServe's own settings (15 steps, zero baseline, target 0 unless given), so the TorchServe front
batches, limits and cancels exactly as REST does. Registering an archive maps TorchServe's
settings onto hookserve's (`batch_size` -> max_batch_size, `max_batch_delay` -> max_batch_delay_ms)
and says which it cannot honour: workers are the server's executor threads, the same for every model.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import torch

from service.config import Settings
from service.dataplane.attribution import Attribution
from service.dataplane.inference import Inference, Predictions
from service.errors import BadInput, Conflict, NotFound
from service.introspection.attribution.requests import request_class
from service.registry.archives import Archive, open_archive
from service.registry.paths import resolve_under
from service.runtime.fleet import Entry, Fleet, Status
from service.schemas.predict import PredictRequest

UPLOADED = "(request body)"  # stands in the request for the image given beside it
IG_STEPS = 15  # TorchServe's VisionHandler: IntegratedGradients(model).attribute(x, target=target, n_steps=15)
TORCHSERVE_VERSION = "1"  # the version of a model that did not come from an archive


@dataclass(frozen=True)
class Registered:
    """A model registered from an archive through the management API."""

    url: str
    archive: Archive
    started: float = field(default_factory=time.time)


@dataclass(frozen=True)
class Registration:
    """The management API's answer to a registration: TorchServe's status line, and what did not map."""

    status: str
    ready: bool
    not_mapped: dict[str, str]


@dataclass(frozen=True)
class Worker:
    id: str
    start_time: str
    status: str
    pid: int
    gpu: bool


@dataclass(frozen=True)
class Description:
    """`GET /models/{name}` in the terms of TorchServe's management API."""

    name: str
    version: str
    url: str
    workers: list[Worker]
    batch_size: int
    max_batch_delay_ms: int
    pending: int
    remaining: int


class TorchServeApi(Inference, Attribution):
    """The TorchServe-compatible front's operations. Listed first in `DataPlane`, as it builds on two parts."""

    def __init__(self, settings: Settings, fleet: Fleet, decode_pool: ThreadPoolExecutor) -> None:
        super().__init__(settings, fleet, decode_pool)
        self.archives: dict[str, Registered] = {}

    # ---- inference API ---------------------------------------------------------------------

    async def ts_predict(self, name: str, version: str | None, image: bytes) -> Predictions:
        """The top 5 classes of one image, as TorchServe's image_classifier answers them."""
        self.ts_check_version(name, version)
        body = PredictRequest.model_validate({"model": name, "inputs": [{"image": UPLOADED}], "top_k": 5})
        return await self.predict(body, [image])

    async def ts_explain(self, name: str, version: str | None, image: bytes, target: int | None) -> torch.Tensor:
        """Integrated Gradients of `target` (default class 0, as TorchServe) over the image: `[C, H, W]`."""
        self.ts_check_version(name, version)
        body = request_class("integrated_gradients").model_validate(
            {
                "model": name,
                "inputs": [{"image": UPLOADED}],
                "method": "integrated_gradients",
                "steps": IG_STEPS,
                "target": target or 0,
            }
        )
        found = await self.saliency(body, [image])
        attribution: torch.Tensor = found.items[0].attribution
        return attribution

    def ts_check_version(self, name: str, version: str | None) -> None:
        found = self.ts_version(name)
        if version is not None and version != found:
            raise NotFound(f"Model version: {version} does not exist for model: {name}")

    def ts_version(self, name: str) -> str:
        self.fleet.entry(name)  # 404 for an unknown model
        registered = self.archives.get(name)
        return registered.archive.version if registered is not None else TORCHSERVE_VERSION

    def ts_healthy(self) -> bool:
        return self.not_ready_models() == []

    def not_ready_models(self) -> list[str]:
        return [e.spec.name for e in self.fleet.entries() if e.status is not Status.ready]

    # ---- management API --------------------------------------------------------------------

    def ts_models(self) -> list[tuple[str, str]]:
        """(name, url) of every model, by name."""
        return [(e.spec.name, self._url(e)) for e in sorted(self.fleet.entries(), key=lambda e: e.spec.name)]

    def ts_describe(self, name: str, version: str | None) -> Description:
        self.ts_check_version(name, version)
        entry = self.fleet.entry(name)
        status = {Status.ready: "READY", Status.loading: "LOADING", Status.failed: "UNAVAILABLE"}[entry.status]
        started = self.archives[name].started if name in self.archives else time.time()
        start = datetime.fromtimestamp(started, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        executor = entry.executor
        threads = executor.config.threads if executor is not None else self.settings.worker_threads
        gpu = entry.model is not None and entry.model.device.type == "cuda"
        workers = [Worker(str(9000 + i), start, status, os.getpid(), gpu) for i in range(max(1, threads))]
        spec = entry.spec
        depth = executor.queue_depth if executor is not None else 0
        delay = self.settings.max_batch_delay_ms if spec.max_batch_delay_ms is None else spec.max_batch_delay_ms
        return Description(
            name=name,
            version=self.ts_version(name),
            url=self._url(entry),
            workers=workers,
            batch_size=spec.max_batch_size or self.settings.max_batch_size,
            max_batch_delay_ms=round(delay),
            pending=depth,
            remaining=max(0, self.settings.max_queue - depth),
        )

    async def ts_register(
        self,
        *,
        url: str,
        name: str | None,
        batch_size: int | None,
        max_batch_delay_ms: int | None,
        ignored: dict[str, str],
        synchronous: bool,
    ) -> Registration:
        """Register the archive `url` (a `.mar` under the model dir); `ignored`: TorchServe settings given that
        hookserve does not take, with why, for the answer."""
        if "://" in url:
            raise BadInput(f"url {url!r}: hookserve downloads nothing; give an archive's path under the model dir")
        path = resolve_under(Path(self.settings.model_dir), url)
        archive = await asyncio.get_running_loop().run_in_executor(
            None, open_archive, path, self.settings.max_upload_bytes
        )
        model = name or archive.name
        try:
            if model in self.fleet:
                raise Conflict(f"Model version {archive.version} is already registered for model {model}")
            spec = archive.spec(model, max_batch_size=batch_size, max_batch_delay_ms=max_batch_delay_ms)
            entry = self.fleet.add(spec, root=archive.root)
        except BaseException:
            shutil.rmtree(archive.root, ignore_errors=True)
            raise
        self.archives[model] = Registered(url, archive)
        threads = self.settings.worker_threads
        not_mapped = dict(ignored)
        if not synchronous:
            status = f'Model "{model}" Version: {archive.version} registered; it is loading (GET /models/{model})'
            return Registration(status, False, not_mapped)
        if entry.task is not None:
            await asyncio.shield(entry.task)
        if entry.status is not Status.ready:
            error = entry.error or "failed to load"
            await self.ts_unregister(model, None)
            raise Conflict(f'Model "{model}" failed to load and was not registered: {error}')
        status = f'Model "{model}" Version: {archive.version} registered with {threads} initial workers'
        return Registration(status, True, not_mapped)

    async def ts_unregister(self, name: str, version: str | None) -> str:
        self.ts_check_version(name, version)
        await self.fleet.remove(name)
        self.fleet.retired.pop(name, None)  # an archive's files go with it: /v2's repository cannot reload it
        registered = self.archives.pop(name, None)
        if registered is not None:
            shutil.rmtree(registered.archive.root, ignore_errors=True)
        return f'Model "{name}" unregistered'

    def ts_scale(self, name: str, version: str | None, min_worker: int | None, max_worker: int | None) -> str:
        """Workers are not per model here: say what runs, and that nothing changed."""
        self.ts_check_version(name, version)
        entry = self.fleet.entry(name)
        threads = entry.executor.config.threads if entry.executor is not None else self.settings.worker_threads
        asked = ", ".join(
            f"{key}={value}" for key, value in (("min_worker", min_worker), ("max_worker", max_worker)) if value
        )
        unchanged = f"; {asked} not applied" if asked and {min_worker, max_worker} - {None, threads} else ""
        return (
            f"Workers of model {name} unchanged: hookserve runs every model on {threads} executor threads "
            f"(HOOKSERVE_WORKER_THREADS, set at start){unchanged}"
        )

    def close_archives(self) -> None:
        """Remove every extracted archive (at shutdown)."""
        for registered in self.archives.values():
            shutil.rmtree(registered.archive.root, ignore_errors=True)
        self.archives.clear()

    def _url(self, entry: Entry) -> str:
        registered = self.archives.get(entry.spec.name)
        return registered.url if registered is not None else f"{entry.spec.source.value}:{entry.spec.architecture}"
