"""The model executor: the only code that runs a model (DESIGN.md invariant 1).

Worker threads take jobs from one bounded queue. Prediction jobs of the same input shape
are merged into one batch (flushed at `max_batch_size`, after `max_batch_delay_ms`, or at
once when no other request for this model is on its way) and run under the shared side of
a reader-writer lock, so several batches may run in parallel. Jobs that register hooks run
under the exclusive side: no other job touches the model while their hooks exist.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Future
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from service.errors import DeadlineExceeded, HookserveError, Unavailable
from service.registry.loaded import LoadedModel
from service.runtime.batching import run_batch
from service.runtime.jobs import BatchJob, CallJob, JobKind, JobQueue
from service.runtime.rwlock import ReadWriteLock
from service.runtime.threads import ThreadBudget, pin_torch_threads

T = TypeVar("T")
log = logging.getLogger("hookserve.executor")


@dataclass(frozen=True)
class ExecutorConfig:
    threads: int = 1
    max_batch_size: int = 8
    max_batch_delay_ms: float = 5.0
    max_queue: int = 256
    timeout_s: float | None = None  # per-job deadline: 504 after it


@dataclass
class ExecutorStats:
    batches: int = 0
    batched_samples: int = 0
    exclusive_jobs: int = 0


@dataclass(frozen=True)
class JobRecord:
    """What an executor reports after each batch or job (for metrics): where its time went."""

    model: str
    kind: JobKind
    samples: int  # inputs in a prediction batch; 0 for other jobs
    waited_s: tuple[float, ...]  # per job: queued -> began (batching delay, lock and thread waits included)
    ran_s: float  # began -> done: the batch or job running on the model


JobObserver = Callable[[JobRecord], None]


class ModelExecutor:
    """Owns one LoadedModel; every torch call on it happens on this executor's threads."""

    def __init__(
        self,
        model: LoadedModel,
        config: ExecutorConfig,
        on_job: JobObserver | None = None,
        budget: ThreadBudget | None = None,
    ) -> None:
        self.model = model
        self._budget = budget or ThreadBudget(config.threads, 1)  # standalone: one thread per job
        self._uses_cpu_threads = model.device.type == "cpu"
        self.config = config
        self.stats = ExecutorStats()
        self._queue = JobQueue(config.max_queue)
        self._lock = ReadWriteLock()
        self._incoming = 0
        self._incoming_lock = threading.Lock()
        self._on_job = on_job
        self._threads = [
            threading.Thread(target=self._work, name=f"hookserve-{model.name}-{i}", daemon=True)
            for i in range(max(1, config.threads))
        ]
        for thread in self._threads:
            thread.start()

    # ---- submission (event loop side) -------------------------------------------------
    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    async def predict(
        self, inputs: torch.Tensor | Awaitable[torch.Tensor], post: Callable[[Any], T] | None = None
    ) -> Any:
        """Forward `inputs` [N, ...] as part of a dynamic batch; returns `post(this request's output slice)`.

        `inputs` may be an awaitable (the request's decoding): while it runs, batches of this
        model may wait for it, up to `max_batch_delay_ms`.
        """
        future: Future[Any] = Future()
        if isinstance(inputs, torch.Tensor):
            self._queue.put(BatchJob(future, inputs, post))
        else:
            with self._incoming_request():
                self._queue.put(BatchJob(future, await inputs, post))
        return await self._wait(future)

    @contextmanager
    def _incoming_request(self) -> Iterator[None]:
        """Count a request being decoded (batchers may wait for it) until it is queued or fails."""
        with self._incoming_lock:
            self._incoming += 1
        try:
            yield
        finally:
            with self._incoming_lock:
                self._incoming -= 1
            self._queue.wake()

    async def run_exclusive(self, fn: Callable[[], T]) -> T:
        """Run `fn` on a worker thread while holding the model exclusively (hooks allowed)."""
        future: Future[T] = Future()
        self._queue.put(CallJob(future, fn, JobKind.exclusive))
        return await self._wait(future)

    async def run_shared(self, fn: Callable[[], T]) -> T:
        """Run `fn` on a worker thread beside prediction batches (reads only, no hooks)."""
        future: Future[T] = Future()
        self._queue.put(CallJob(future, fn, JobKind.shared))
        return await self._wait(future)

    async def _wait(self, future: Future[T]) -> T:
        """Await a job within the deadline; a job still queued at the deadline never runs."""
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), self.config.timeout_s)
        except TimeoutError:
            stage = "running (its result was dropped)" if future.running() else "queued (it will not run)"
            raise DeadlineExceeded(
                f"the {self.config.timeout_s:g} s deadline (request_timeout_s) passed while the job was {stage}; "
                "ask for fewer inputs, fewer steps or samples, or retry when the model is less busy"
            ) from None

    def stop(self, timeout: float = 30.0) -> None:
        """Finish queued jobs, then end the threads."""
        self._queue.close()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    # ---- worker side ------------------------------------------------------------------
    def _more_coming(self) -> bool:
        return self._incoming > 0

    def _alone(self) -> bool:
        """Nothing else queued, running, or being decoded for this model: a job may use every core."""
        return (
            len(self._queue) == 0 and self._incoming == 0 and self._lock.readers == 0 and not self._lock.writer_active
        )

    def _call(self, fn: Callable[[], T], lock: Callable[[], AbstractContextManager[None]]) -> tuple[T, float]:
        """Run `fn` holding `lock`; CPU models within the process's thread budget (taken first, so a
        job can tell whether it runs alone), GPU models on this driver thread.

        Returns `fn`'s result and the moment it began: once it held the lock and its threads."""
        began = 0.0

        def locked() -> T:
            nonlocal began
            with lock():
                began = time.perf_counter()
                return fn()

        result = self._budget.run(locked, self._alone) if self._uses_cpu_threads else locked()
        return result, began

    def _work(self) -> None:
        pin_torch_threads(1)
        while (job := self._queue.take()) is not None:
            if isinstance(job, BatchJob):
                delay = self.config.max_batch_delay_ms / 1000.0
                batch = self._queue.take_batch(job, self.config.max_batch_size, delay, self._more_coming)
                live = [j for j in batch if j.future.set_running_or_notify_cancel()]
                if live:
                    self._run_predict(live)
            elif job.future.set_running_or_notify_cancel():
                self._run_function(job)

    def _report(self, kind: JobKind, jobs: list[BatchJob] | list[CallJob], samples: int, began: float) -> None:
        if self._on_job is not None:
            waited = tuple(max(0.0, began - j.enqueued) for j in jobs)
            self._on_job(JobRecord(self.model.name, kind, samples, waited, time.perf_counter() - began))

    def _run_predict(self, jobs: list[BatchJob]) -> None:
        try:
            inputs = [j.inputs for j in jobs]
            outputs, began = self._call(lambda: run_batch(self.model, inputs), self._lock.shared)
        except BaseException as exc:  # every waiter must hear about the failure
            error = _domain_error(exc, self.model)
            for job in jobs:
                job.future.set_exception(error)
            return
        samples = sum(j.size for j in jobs)
        self.stats.batches += 1
        self.stats.batched_samples += samples
        self._report(JobKind.predict, jobs, samples, began)
        for job, output in zip(jobs, outputs, strict=True):
            try:
                job.future.set_result(job.post(output) if job.post is not None else output)
            except BaseException as exc:
                job.future.set_exception(_domain_error(exc, self.model))

    def _run_function(self, job: CallJob) -> None:
        lock = self._lock.exclusive if job.kind is JobKind.exclusive else self._lock.shared
        try:
            result, began = self._call(job.fn, lock)
        except BaseException as exc:
            job.future.set_exception(_domain_error(exc, self.model))
            return
        if job.kind is JobKind.exclusive:
            self.stats.exclusive_jobs += 1
        self._report(job.kind, [job], 0, began)
        job.future.set_result(result)


def _domain_error(exc: BaseException, model: LoadedModel) -> BaseException:
    """Device OOM becomes a 503 (caches released); domain errors pass; anything else is logged."""
    if isinstance(exc, torch.OutOfMemoryError):
        release_device_memory(model.device)
        return Unavailable(f"device out of memory running {model.name}; retry with fewer inputs", retry_after=2)
    if not isinstance(exc, HookserveError):
        log.error("job on %s failed", model.name, exc_info=exc)
    return exc


def release_device_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    elif device.type == "mps":
        torch.mps.empty_cache()
