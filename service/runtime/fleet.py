"""The served models: each one's status, its loaded model and its executor; background loads, add, remove.

The registry package is the catalogue (specs, sources, weights, `load_model`); the fleet
runs what it loads. A removed model's spec is remembered, so /v2's repository can load it back.
Each load runs on its own thread (`service.runtime.loads`): one past `load_timeout_s`, or whose
model is removed, is abandoned at once, and whatever it builds later is never installed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from service.config import Settings
from service.errors import Conflict, ModelLoadError, unknown_model
from service.registry.capture_plans import PlanSettings
from service.registry.fast_path import PathDefaults
from service.registry.loaded import LoadedModel
from service.registry.loader import load_model
from service.runtime.executor import ExecutorConfig, JobObserver, ModelExecutor, release_device_memory
from service.runtime.loads import Load, Loads
from service.runtime.threads import ThreadBudget
from service.specs.model import ModelSpec

log = logging.getLogger("hookserve.registry")
# How long closing the fleet lets each model's jobs finish (all models at once). By then the shutdown grace period
# has passed and every request still running was answered 503, so a job left is abandoned: it stops at its next
# forward, or the process leaves without it.
CLOSE_WITHIN_S = 0.5


class Status(StrEnum):
    loading = "loading"
    ready = "ready"
    failed = "failed"


@dataclass(frozen=True)
class Retired:
    """What a removed model was: enough to load it again."""

    spec: ModelSpec
    root: Path | None


@dataclass(frozen=True)
class ServedModel:
    """A ready model and the executor that alone runs it."""

    model: LoadedModel
    executor: ModelExecutor

    @property
    def name(self) -> str:
        return self.model.name


@dataclass
class Entry:
    spec: ModelSpec
    status: Status = Status.loading
    error: str | None = None
    model: LoadedModel | None = None
    executor: ModelExecutor | None = None
    load_seconds: float | None = None
    root: Path | None = None  # model dir for this entry's paths; None = the server's
    task: asyncio.Future[None] | None = field(default=None, repr=False)
    load: Load[LoadedModel] | None = field(default=None, repr=False)  # while loading


class Fleet:
    """Name -> Entry. Each load runs on its own thread so the event loop, and every other load, keeps going."""

    def __init__(
        self,
        settings: Settings,
        on_job: JobObserver | None = None,
        on_remove: Callable[[str], None] | None = None,
    ) -> None:
        self.settings = settings
        self._entries: dict[str, Entry] = {}
        self._loads = Loads(exit_wait_s=settings.shutdown_grace_s)  # a load must not be torn down mid-torch
        self._on_job = on_job
        self._on_remove = on_remove
        self.retired: dict[str, Retired] = {}  # removed models, so a repository load can bring them back
        self.budget = ThreadBudget(settings.cpu_threads, settings.torch_threads)

    @property
    def abandoned_loads(self) -> int:
        """Loads given up (timed out, or their model removed) whose thread is still running."""
        return self._loads.abandoned_running

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def entries(self) -> list[Entry]:
        return list(self._entries.values())

    def entry(self, name: str) -> Entry:
        entry = self._entries.get(name)
        if entry is None:
            raise unknown_model(name, self._entries)
        return entry

    def ready(self, name: str) -> ServedModel:
        """The model called `name` if it is ready: 404 when unknown, 409 while loading or failed."""
        entry = self.entry(name)
        if entry.status is not Status.ready or entry.model is None or entry.executor is None:
            why = f": {entry.error}" if entry.error else ""
            raise Conflict(f"model {name!r} is {entry.status}{why}")
        return ServedModel(entry.model, entry.executor)

    def add(self, spec: ModelSpec, root: Path | None = None) -> Entry:
        """Register a spec and start loading it in the background (replaces a failed entry)."""
        existing = self._entries.get(spec.name)
        if existing is not None and existing.status is not Status.failed:
            raise Conflict(f"model {spec.name!r} already exists ({existing.status}); DELETE it first")
        entry = Entry(spec, root=root)
        self._entries[spec.name] = entry
        self.retired.pop(spec.name, None)
        s = self.settings
        where = root or s.model_dir
        defaults = PathDefaults(
            onnxruntime=s.onnxruntime, wide_threads=s.torch_threads, packed_convolutions=s.packed_convolutions
        )
        entry.load = self._loads.start(
            spec.name, lambda: load_model(spec, where, s.device, s.allow_downloads, defaults)
        )
        entry.task = asyncio.ensure_future(self._install(entry, entry.load, time.perf_counter()))
        return entry

    async def _install(self, entry: Entry, load: Load[LoadedModel], started: float) -> None:
        """Wait for the load (at most `load_timeout_s`), then serve its model unless the entry was removed."""
        s, spec = self.settings, entry.spec
        try:
            model = await asyncio.wait_for(asyncio.shield(load.future), s.load_timeout_s)
        except TimeoutError:
            load.abandon(
                f"did not load within load_timeout_s = {s.load_timeout_s:g} s (HOOKSERVE_LOAD_TIMEOUT_S); "
                "the load was abandoned"
            )
            model = None
        except ModelLoadError:  # it failed, or the entry was removed: the load's future says which
            model = None
        finally:
            entry.load = None
        if self._entries.get(spec.name) is not entry:  # removed while it loaded: its load was abandoned
            return
        if model is None:
            error = load.future.exception()
            entry.status, entry.error = Status.failed, str(error)
            log.warning("model %s failed to load: %s", spec.name, error)
            return
        config = ExecutorConfig(
            threads=s.worker_threads,
            max_batch_size=spec.max_batch_size or s.max_batch_size,
            max_batch_delay_ms=s.max_batch_delay_ms if spec.max_batch_delay_ms is None else spec.max_batch_delay_ms,
            max_queue=s.max_queue,
            timeout_s=s.request_timeout_s,
            plans=PlanSettings(limit=s.capture_plans, after=s.plan_after_requests),
        )
        entry.executor = ModelExecutor(model, config, self._on_job, self.budget)
        entry.model = model
        entry.load_seconds = time.perf_counter() - started
        entry.status = Status.ready
        log.info("model %s ready on %s in %.2fs", spec.name, model.device, entry.load_seconds)

    async def remove(self, name: str, *, release: bool = True, finish_within: float | None = None) -> Entry:
        """Unregister, finish its queued jobs (within `finish_within` s, default `shutdown_grace_s`) and release
        its memory before returning.

        `release=False` skips the (slow, full) garbage collection: `close` runs one for all models.
        """
        entry = self.entry(name)
        del self._entries[name]
        self.retired[name] = Retired(entry.spec, entry.root)
        if self._on_remove is not None:
            self._on_remove(name)
        if entry.load is not None:  # answers at once: the load's thread may never return
            entry.load.abandon(f"model {name!r} was removed while it was loading")
        executor, model = entry.executor, entry.model
        entry.executor = entry.model = None
        if executor is not None:
            within = self.settings.shutdown_grace_s if finish_within is None else finish_within
            await asyncio.get_running_loop().run_in_executor(None, executor.stop, within)
        if model is not None:
            device = model.device
            del model
            if release:  # gc.collect takes a fraction of a second: off the event loop
                await asyncio.get_running_loop().run_in_executor(None, release_device_memory, device)
        return entry

    async def close(self, within: float = CLOSE_WITHIN_S) -> None:
        """Remove every model at once, each executor given `within` seconds to finish its jobs.

        By the time the server closes the fleet it has waited out `shutdown_grace_s` for requests,
        so a job still running was cut: waiting a grace period per model again would only delay exit."""
        devices = {e.model.device for e in self._entries.values() if e.model is not None}
        await asyncio.gather(*(self.remove(name, release=False, finish_within=within) for name in list(self._entries)))
        for device in devices:
            await asyncio.get_running_loop().run_in_executor(None, release_device_memory, device)
        self.budget.close()
