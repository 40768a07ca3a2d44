"""The jobs façade: start, list, read, cancel and answer data-set jobs; run them chunk by chunk.

A job's chunk (`job_chunk_size` samples) is decoded on the decode pool, then runs on the model's
executor as one *background* hooked batch (the activations runner, capturing the job's layers), which
the scheduler starts only when no interactive request can: a job never holds more than one chunk in
a model's queue, so an interactive request waits one chunk at most. The reduction folds each chunk
in off the event loop; every `job_checkpoint_s` its state is written (safetensors, with the count of
samples done), so a server that stops mid-job resumes it at the last checkpoint when it starts again.
Cancelling abandons the running chunk (it stops at its next forward) and the job stops there.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from service.codecs.pictures import exemplar_maps_png
from service.config import Settings
from service.dataplane.plane import DataPlane
from service.errors import Conflict, HookserveError, InvalidField, NotFound, TooLarge, first_line
from service.introspection.layers import resolve_layers
from service.jobs.datasets import Dataset, Loaded, open_dataset
from service.jobs.features import INDEX as FEATURES_INDEX
from service.jobs.features import FeaturesReduction
from service.jobs.kinds import Reduction, SteeringReduction, job_bytes, reduction, unit_count
from service.jobs.store import DATABASE, MAX_LISTED_ERRORS, JobRow, JobStore
from service.registry.steering_vectors import SteeringVector, check_name, vectors_at, vectors_dir
from service.runtime.runners.activations import ACTIVATIONS, CaptureRequest, CaptureResult
from service.schemas.jobs import JobRequest
from service.specs.vocab import JobKindName, JobState

log = logging.getLogger("hookserve.jobs")

CHECKPOINT = "checkpoint.safetensors"
RESULT = "result.json"


class JobManager:
    """Every job of this server: the store on disk and a task per job not yet finished."""

    def __init__(self, settings: Settings, plane: DataPlane) -> None:
        self.settings = settings
        self.plane = plane
        self._root = settings.jobs_dir or settings.model_dir / ".jobs"
        self._store: JobStore | None = None
        self._slots = asyncio.Semaphore(settings.max_running_jobs)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.vectors = vectors_at(vectors_dir(settings))
        self._cancelled: set[str] = set()

    # ---- lifecycle -----------------------------------------------------------------------------
    @property
    def store(self) -> JobStore:
        """The store, created by the first job: a server that runs none writes nothing under the model dir."""
        if self._store is None:
            self._store = JobStore(self._root)
        return self._store

    def _existing(self) -> JobStore | None:
        """The store if some job ever made one (opening an existing database creates nothing)."""
        if self._store is None and (self._root / DATABASE).is_file():
            self._store = JobStore(self._root)
        return self._store

    def resume(self) -> None:
        """Start a task for every job the last server left queued or running."""
        store = self._existing()
        for row in store.all() if store is not None else []:
            if not row.finished_state:
                self._launch(row)

    async def close(self) -> None:
        """Stop every task; their jobs stay `running` or `queued` in the store, to resume on the next start."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._store is not None:
            self._store.close()

    # ---- the API -------------------------------------------------------------------------------
    async def submit(self, body: JobRequest) -> JobRow:
        """Check everything a job needs before it is stored: model, layers, data set, disk."""
        served = self.plane.ready(body.model)
        model = served.model
        layers = resolve_layers(model.layer_names, body.layers, self.settings.max_layers)
        dataset = await self.plane.off_loop(open_dataset, body.dataset, self.settings.data_dir)
        total = len(dataset) if body.limit is None else min(body.limit, len(dataset))
        parameters = body.parameters.model_dump()
        shapes = model.layer_shapes.outputs
        counts = {
            key: unit_count(body.kind, parameters, found[0].shape)
            for key in shapes
            for found in [shapes[key]]
            if _of(key, layers)
        }
        if body.kind is JobKindName.steering_vector:
            self._check_steering(body, dataset, counts)
        if body.kind is JobKindName.similarity and len(counts) < 2:
            raise InvalidField(
                f"similarity compares layers: {body.layers} resolved to {sorted(counts) or 'no output'}; "
                "name at least two layers"
            )
        needed = job_bytes(body.kind, parameters, counts, total)
        if needed > self.settings.max_job_bytes:
            raise TooLarge(
                f"this job's checkpoint and result would take about {needed} bytes, over the limit of "
                f"{self.settings.max_job_bytes} (max_job_bytes); {_way_out(body.kind)}"
            )
        if self.store.count() >= self.settings.max_jobs:
            raise Conflict(
                f"{self.settings.max_jobs} jobs are kept (max_jobs); delete finished ones first (DELETE /jobs/{{id}})"
            )
        row = JobRow(
            secrets.token_hex(8), body.kind.value, model.name, dataset.name, layers, parameters, JobState.queued, total
        )
        self.store.add(row)
        self._launch(row)
        return row

    def _check_steering(self, body: JobRequest, dataset: Dataset, counts: dict[str, int]) -> None:
        given = body.parameters
        if given.name is None or given.positive is None or given.negative is None:
            raise InvalidField(
                "a steering_vector job needs parameters.name, parameters.positive and parameters.negative"
            )
        for side in (given.positive, given.negative):
            if side not in dataset.classes:
                raise InvalidField(f"dataset {dataset.name!r} has no class {side!r} (classes: {dataset.classes})")
        if given.positive == given.negative:
            raise InvalidField("parameters.positive and parameters.negative must be two different classes")
        if len(counts) != 1:
            raise InvalidField(
                f"a steering vector is taken at one layer output: {body.layers} resolved to {sorted(counts)}"
            )
        self.vectors.reserve(check_name(given.name))

    def all(self) -> list[JobRow]:
        store = self._existing()
        return store.all() if store is not None else []

    def get(self, job_id: str) -> JobRow:
        store = self._existing()
        row = store.get(job_id) if store is not None else None
        if row is None:
            raise NotFound(f"no job {job_id!r}; GET /jobs lists them")
        return row

    async def cancel(self, job_id: str) -> JobRow:
        """Stop a queued or running job (within its chunk; it is kept, `cancelled`); a finished job is deleted
        with its files. Either way the job as it was last is returned."""
        row = self.get(job_id)
        if row.finished_state:
            await self.plane.off_loop(self.store.delete, job_id)
            return row
        self._cancelled.add(job_id)
        task = self._tasks.get(job_id)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        row = self.get(job_id)
        if not row.finished_state:
            self._finish(row, JobState.cancelled)
        return self.get(job_id)

    async def result(self, job_id: str) -> bytes:
        """A succeeded job's result file (read off the event loop: it may be megabytes)."""
        row = self.get(job_id)
        if row.state is not JobState.succeeded:
            raise Conflict(f"job {job_id} is {row.state}; its result exists once it has succeeded")
        data = await self.plane.off_loop(self.store.read, job_id, RESULT)
        if data is None:
            raise NotFound(f"job {job_id}'s result file is missing")
        return data

    def file(self, job_id: str, name: str) -> Path:
        """A file a succeeded job wrote (a features job's `index.json` and shards; any job's `result.json`)."""
        row = self.get(job_id)
        if row.state is not JobState.succeeded:
            raise Conflict(f"job {job_id} is {row.state}; its files are served once it has succeeded")
        path = self.store.path(job_id, name) if name != CHECKPOINT else None
        if path is None:
            raise NotFound(f"job {job_id} wrote no file {name!r}; its result lists its files")
        return path

    async def exemplar_maps(self, job_id: str, layer: str, unit: int, alpha: float) -> bytes:
        """PNG: an exemplars job's top samples of one unit, each with the unit's map over it (one shared scale)."""
        row = self.get(job_id)
        if row.kind != JobKindName.exemplars.value:
            raise InvalidField(f"job {job_id} is a {row.kind} job; exemplar maps come from an exemplars job")
        result = json.loads(await self.result(job_id))
        layers: dict[str, list[list[dict[str, Any]]]] = result["layers"]
        if layer not in layers:
            raise InvalidField(f"job {job_id} ranked no layer {layer!r}; it ranked {sorted(layers)}")
        if not 0 <= unit < len(layers[layer]):
            raise InvalidField(f"{layer!r} has units 0..{len(layers[layer]) - 1}; unit {unit} is not one of them")
        served = self.plane.ready(row.model)
        model = served.model
        dataset = await self.plane.off_loop(open_dataset, row.dataset, self.settings.data_dir)
        indices = [int(sample["index"]) for sample in layers[layer][unit]]
        loaded: Loaded = await self.plane.off_loop(dataset.load, indices, model, self.settings.max_image_pixels)
        if loaded.inputs is None or loaded.failed:
            raise Conflict(f"the job's samples {[i for i, _ in loaded.failed]} can no longer be read")
        base = layer.split("#", 1)[0]
        answer: CaptureResult = await served.executor.submit(ACTIVATIONS, loaded.inputs, CaptureRequest((base,)))
        t = answer.captured[layer]["output"]
        if t.ndim != 4:
            raise InvalidField(
                f"{layer!r} gives {list(t.shape[1:])} per sample: maps need a feature map [C, H, W]; "
                "the result's scores are the whole story for it"
            )
        return await self.plane.off_loop(exemplar_maps_png, loaded.inputs, t[:, unit], model.preprocess, alpha)

    # ---- running -------------------------------------------------------------------------------
    def _launch(self, row: JobRow) -> None:
        task = asyncio.get_running_loop().create_task(self._run(row.id), name=f"hookserve-job-{row.id}")
        self._tasks[row.id] = task
        task.add_done_callback(lambda _: self._tasks.pop(row.id, None))

    async def _run(self, job_id: str) -> None:
        async with self._slots:
            row = self.get(job_id)
            try:
                await self._chunks(row)
            except asyncio.CancelledError:
                if job_id in self._cancelled:
                    self._finish(self.get(job_id), JobState.cancelled)
                raise
            except HookserveError as exc:
                self._finish(self.get(job_id), JobState.failed, str(exc.detail))
            except Exception as exc:
                log.error("job %s failed", job_id, exc_info=exc)
                self._finish(self.get(job_id), JobState.failed, first_line(exc))

    async def _chunks(self, row: JobRow) -> None:
        served = await self._wait_ready(row.model)
        model = served.model
        dataset = await self.plane.off_loop(open_dataset, row.dataset, self.settings.data_dir)
        kind = JobKindName(row.kind)
        found = reduction(kind, row.parameters, dataset)
        done = self._restore(row, found)
        row.resumed_from = done if row.started is not None else None
        row.state, row.done, row.started = JobState.running, done, row.started or time.time()
        self.store.save(row)
        request = CaptureRequest(tuple(row.layers), bulk=True)
        began, began_at, saved = time.monotonic(), done, time.monotonic()
        chunk = self.settings.job_chunk_size
        while done < row.total:
            if row.id in self._cancelled:  # a cancellation the awaits below let pass (asyncio.wait_for on 3.11 can)
                raise asyncio.CancelledError
            indices = list(range(done, min(done + chunk, row.total)))
            loaded: Loaded = await self.plane.off_loop(dataset.load, indices, model, self.settings.max_image_pixels)
            if loaded.inputs is not None:
                answer: CaptureResult = await served.executor.submit(
                    ACTIVATIONS, loaded.inputs, request, background=True
                )
                captured = {key: sides["output"] for key, sides in answer.captured.items() if "output" in sides}
                await self.plane.off_loop(found.update, captured, torch.tensor(loaded.indices))
                await self._write_files(row, found)
            self._errors(row, dataset, loaded.failed)
            done = indices[-1] + 1
            row.done = done
            elapsed = time.monotonic() - began
            row.rate = (done - began_at) / elapsed if elapsed > 0 else None
            if time.monotonic() - saved >= self.settings.job_checkpoint_s or done >= row.total:
                await self._checkpoint(row, found)
                saved = time.monotonic()
            self.store.save(row)
        if not found.started:
            raise _NoSamples(f"none of the {row.total} samples could be read; see the job's errors")
        found.finish()
        await self._write_files(row, found)
        if isinstance(found, FeaturesReduction):
            index = found.index(row.model, row.layers, self.settings.job_chunk_size)
            await self.plane.off_loop(self.store.write, row.id, FEATURES_INDEX, index.encode())
        result = await self.plane.off_loop(_encode_result, found, dataset, row)
        self._check_bytes(row, len(result))
        if isinstance(found, SteeringReduction):
            await self.plane.off_loop(self._store_vector, found, row)
        await self.plane.off_loop(self.store.write, row.id, RESULT, result)
        self.store.remove(row.id, CHECKPOINT)
        self._finish(row, JobState.succeeded)

    async def _wait_ready(self, name: str) -> Any:
        """The model, once loaded (a resumed job may start before its model has finished loading)."""
        while True:
            try:
                return self.plane.ready(name)
            except Conflict as exc:
                if "loading" not in str(exc.detail):
                    raise
            await asyncio.sleep(0.2)

    def _restore(self, row: JobRow, found: Reduction) -> int:
        """Samples done at the last checkpoint (0 without one), with the reduction's state and the errors then."""
        data = self.store.read(row.id, CHECKPOINT)
        if data is None:
            row.errors, row.error_count = [], 0
            return 0
        found.restore(load_tensors(data))
        meta = json.loads(checkpoint_metadata(data).get("job", "{}"))
        row.errors, row.error_count = meta.get("errors", []), int(meta.get("error_count", 0))
        return int(meta.get("done", 0))

    async def _checkpoint(self, row: JobRow, found: Reduction) -> None:
        """The reduction's state and the samples done so far, in one file replaced whole."""
        meta = {"job": json.dumps({"done": row.done, "errors": row.errors, "error_count": row.error_count})}
        tensors = {k: t.contiguous() for k, t in found.state().items()}
        data = await self.plane.off_loop(lambda: save_tensors(tensors, metadata=meta))
        self._check_bytes(row, len(data))
        await self.plane.off_loop(self.store.write, row.id, CHECKPOINT, data)

    async def _write_files(self, row: JobRow, found: Reduction) -> None:
        """The files the reduction has ready (a features job's shards), each within max_job_bytes with the rest."""
        for name, data in found.take_files().items():
            self._check_bytes(row, self.store.size(row.id) + len(data))
            await self.plane.off_loop(self.store.write, row.id, name, data)

    def _store_vector(self, found: SteeringReduction, row: JobRow) -> None:
        assert found.key is not None
        made = {
            "job": row.id,
            "dataset": row.dataset,
            "positive": {"class": found.classes[0], "count": int(found.counts[0])},
            "negative": {"class": found.classes[1], "count": int(found.counts[1])},
        }
        self.vectors.save(SteeringVector(found.name, found.vector(), row.model, found.key, made))

    def _check_bytes(self, row: JobRow, size: int) -> None:
        if size > self.settings.max_job_bytes:
            raise TooLarge(f"job {row.id} would write {size} bytes, over max_job_bytes ({self.settings.max_job_bytes})")

    def _errors(self, row: JobRow, dataset: Dataset, failed: list[tuple[int, str]]) -> None:
        for index, detail in failed:
            row.error_count += 1
            if len(row.errors) < MAX_LISTED_ERRORS:
                row.errors.append({"index": index, "file": dataset.file(index), "detail": detail})

    def _finish(self, row: JobRow, state: JobState, error: str | None = None) -> None:
        row.state, row.error, row.finished = state, error, time.time()
        self.store.save(row)
        self._cancelled.discard(row.id)


class _NoSamples(HookserveError):
    status = 422


def checkpoint_metadata(data: bytes) -> dict[str, str]:
    """The `__metadata__` of a safetensors file: its header is a little-endian u64 length, then JSON."""
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + size])
    meta = header.get("__metadata__") or {}
    return {str(k): str(v) for k, v in meta.items()}


def _way_out(kind: JobKindName) -> str:
    if kind in (JobKindName.similarity, JobKindName.features):
        return 'name fewer layers, or set parameters.reduce to "mean" (one feature per unit)'
    return "name fewer layers or ask for fewer bins or exemplars"


def _of(key: str, layers: list[str]) -> bool:
    """A capture key (`name`, `name#2`, `name.0`) of one of `layers`."""
    return any(key == layer or key.startswith((f"{layer}#", f"{layer}.")) for layer in layers)


def _encode_result(found: Reduction, dataset: Dataset, row: JobRow) -> bytes:
    body = {"id": row.id, "kind": row.kind, "model": row.model, "dataset": row.dataset, "samples": row.total}
    return json.dumps(body | found.result(dataset)).encode()
