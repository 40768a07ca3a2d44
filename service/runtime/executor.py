"""The model executor: the only code that runs a model (DESIGN.md invariant 1).

Worker threads take batches from the model's scheduler (`scheduler.py` states the order) and
run them with the runner of their kind: predictions on the prediction path (a fused or
compiled copy when the model has one), hooked work (activations, gradients, saliency,
interventions) on a hook lane (a copy of the eager module sharing its weights: one per worker
thread, so hooked batches run side by side as predictions do), batched across requests like
predictions are. CPU work takes its intra-op threads from the process's thread budget.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import torch

from service.errors import DeadlineExceeded, HookserveError, Unavailable
from service.introspection.hooks import HookScope
from service.registry.capture_plans import CapturePlans, PlanSettings
from service.registry.lanes import hook_lanes
from service.registry.loaded import LoadedModel
from service.runtime.jobs import JobKind
from service.runtime.os_threads import executor_name, name_os_thread, plan_name
from service.runtime.runners.base import Runner
from service.runtime.runners.predict import PREDICT
from service.runtime.scheduler import Access, Batch, Job, Scheduler
from service.runtime.statistics import BatchTiming, ModelStatistics, take_phases
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
    plans: PlanSettings = field(default_factory=lambda: PlanSettings(limit=0))  # standalone: hooks only


@dataclass
class ExecutorStats:
    batches: int = 0  # prediction batches
    batched_samples: int = 0  # samples in prediction batches
    exclusive_jobs: int = 0  # jobs that held the eager module (hooked requests, summaries)
    hooked_batches: int = 0  # batches of hooked requests


@dataclass(frozen=True)
class JobRecord:
    """What an executor reports after each batch or job (for metrics): where its time went."""

    model: str
    kind: JobKind
    samples: int  # inputs in the batch; 0 for jobs without inputs
    waited_s: tuple[float, ...]  # per job: queued -> began (batching delay, model and thread waits included)
    ran_s: float  # began -> done: the batch or job running on the model


JobObserver = Callable[[JobRecord], None]


@dataclass(frozen=True)
class _Work:
    """A batchable job's payload: its runner, inputs and request."""

    runner: Runner[Any]
    inputs: torch.Tensor
    request: Any


class Arrival:
    """A request announced to its model's scheduler; `leave()` (idempotent) withdraws it."""

    def __init__(self, scheduler: Scheduler, kind: str) -> None:
        self._scheduler = scheduler
        self._kind = kind
        self._here = True
        scheduler.announce(kind)

    def leave(self) -> None:
        if self._here:
            self._here = False
            self._scheduler.withdraw(self._kind)


_KINDS = {
    Access.FAST: JobKind.predict,
    Access.EAGER_SHARED: JobKind.predict,
    Access.EAGER_EXCLUSIVE: JobKind.exclusive,
    Access.HOOKED: JobKind.exclusive,
    Access.READ: JobKind.shared,
}


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
        self.statistics = ModelStatistics()  # Triton's statistics extension: every request that ran the model
        if not model.lanes and config.threads > 1:
            model.lanes = hook_lanes(model.module, config.threads)
        self._free_lanes = list(model.lanes)
        model.capture_plans = CapturePlans(
            model.module,
            config.plans,
            _plans_refusal(model),
            channels_last=model.channels_last,
            wide_threads=self._budget.max_per_job,
            name=model.name,
            on_build_thread=lambda: _plan_builder_thread(model.name),
        )
        self._scheduler = Scheduler(
            config.max_queue, config.max_batch_size, config.max_batch_delay_ms / 1000.0, lanes=len(model.lanes)
        )
        self._running = 0
        self._running_lock = threading.Lock()
        self._on_job = on_job
        self._threads = [
            threading.Thread(target=self._work, args=(i,), name=f"hookserve-{model.name}-{i}", daemon=True)
            for i in range(max(1, config.threads))
        ]
        for thread in self._threads:
            thread.start()

    # ---- submission (event loop side) -------------------------------------------------
    @property
    def queue_depth(self) -> int:
        return len(self._scheduler)

    @property
    def running(self) -> int:
        """Batches and jobs running now."""
        return self._running

    async def predict(
        self, inputs: torch.Tensor | Awaitable[torch.Tensor], post: Callable[[Any], T] | None = None
    ) -> Any:
        """Forward `inputs` [N, ...] as part of a dynamic batch; returns `post(this request's output slice)`.

        `inputs` may be an awaitable (the request's decoding): while it runs, a forming batch of
        this model may wait for it, up to `max_batch_delay_ms`.
        """
        return await self.submit(PREDICT, inputs, post)

    async def submit(
        self,
        runner: Runner[Any],
        inputs: torch.Tensor | Awaitable[torch.Tensor],
        request: Any,
        arrival: Arrival | None = None,
        *,
        background: bool = False,
    ) -> Any:
        """Run `request` on `inputs` [N, ...] with `runner`, batched with other requests of the same key.

        An awaitable `inputs` (the request's decoding) is announced while it runs; so is a
        request whose `arrival` (from `arriving`) is still open, until it is queued here.
        A `background` job (a data-set job's chunk) runs only when no interactive job can start,
        and shares batches only with other background jobs.
        """
        future: Future[Any] = Future()
        if isinstance(inputs, torch.Tensor):
            job = self._job(future, runner, inputs, request, background)
            try:
                self._scheduler.put(job)
            finally:
                if arrival is not None:
                    arrival.leave()
        else:
            with self.arriving(runner.name):
                job = self._job(future, runner, await inputs, request, background)
                self._scheduler.put(job)
        return await self._wait(future, job)

    async def run_exclusive(self, fn: Callable[[], T]) -> T:
        """Run `fn` on a worker thread holding the eager module alone (hooks allowed)."""
        future: Future[T] = Future()
        job = Job(future, Access.EAGER_EXCLUSIVE, kind="exclusive", payload=fn, size=0)
        self._scheduler.put(job)
        return await self._wait(future, job)

    async def run_shared(self, fn: Callable[[], T]) -> T:
        """Run `fn` on a worker thread; it only reads parameters and metadata (no forward, no hooks)."""
        future: Future[T] = Future()
        job = Job(future, Access.READ, kind="shared", payload=fn, size=0)
        self._scheduler.put(job)
        return await self._wait(future, job)

    def _job(
        self, future: Future[Any], runner: Runner[Any], inputs: torch.Tensor, request: Any, background: bool = False
    ) -> Job:
        if runner.hooked:
            access = Access.HOOKED if self.model.lanes else Access.EAGER_EXCLUSIVE
            batchable = self.model.spec.batch_introspection
        else:
            access = Access.FAST if self.model.fast is not None else Access.EAGER_SHARED
            batchable = True
        key = (
            (runner.name, runner.key(request), tuple(inputs.shape[1:]), inputs.dtype, background) if batchable else None
        )
        work = _Work(runner, inputs, request)
        return Job(future, access, key, int(inputs.shape[0]), runner.name, work, background=background)

    @contextmanager
    def arriving(self, kind: str) -> Iterator[Arrival]:
        """Announce a request of `kind` being prepared (a forming batch may wait for it) until it is
        queued, it fails, or it calls `leave()` (to wait for something else first)."""
        arrival = Arrival(self._scheduler, kind)
        try:
            yield arrival
        finally:
            arrival.leave()

    async def _wait(self, future: Future[T], job: Job | None = None) -> T:
        """Await a job within the deadline; a job given up on (deadline, or its client left) is abandoned:
        dropped while queued, stopped at its next forward while running (when all of its batch left)."""
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), self.config.timeout_s)
        except asyncio.CancelledError:
            if job is not None:
                self._give_up(job)
            raise
        except TimeoutError:
            if job is not None:
                self._give_up(job)
            stage = "running (its result was dropped)" if future.running() else "queued (it will not run)"
            raise DeadlineExceeded(
                f"the {self.config.timeout_s:g} s deadline (request_timeout_s) passed while the job was {stage}; "
                "ask for fewer inputs, fewer steps or samples, or retry when the model is less busy"
            ) from None

    def _give_up(self, job: Job) -> None:
        """Abandon a job nobody waits for any more; a model-running one counts as a failed request."""
        settled = job.future.done() and not job.future.cancelled()  # the worker answered it, and counted that
        if not job.left and not settled and isinstance(job.payload, _Work):
            self.statistics.answered(False, _since(job))
        job.abandon()

    def stop(self, timeout: float = 30.0) -> None:
        """Finish queued jobs, then end the threads; the model's capture plans go with them."""
        self._scheduler.close()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self.model.capture_plans.close()

    # ---- worker side ------------------------------------------------------------------
    def _alone(self) -> bool:
        """Only this batch runs and nothing waits for this model: it may use every core."""
        return self._running == 1 and self._scheduler.quiet

    def _work(self, index: int) -> None:
        name_os_thread(executor_name(self.model.name, index))
        pin_torch_threads(1)
        while self._work_once():
            pass

    def _work_once(self) -> bool:
        """Take and run one batch; False once the scheduler is closed. A function of its own so that nothing
        of the batch (inputs, captures, answers) stays referenced while the thread waits for the next one."""
        batch = self._scheduler.take()
        if batch is None:
            return False
        with self._running_lock:
            self._running += 1
        try:
            live = [job for job in batch.jobs if job.future.set_running_or_notify_cancel()]
            if live:
                self._run(Batch(live, batch.access))
        finally:
            with self._running_lock:
                self._running -= 1
            self._scheduler.done(batch)
        return True

    def _call(self, fn: Callable[[], T], wide: bool = True) -> tuple[T, float]:
        """Run `fn` (CPU models within the thread budget; GPU models on this thread); its result and start.

        `wide`: the work may take every core when it runs alone; long work (many forwards) never does,
        so it cannot hold another model's requests back for its whole length."""
        began = 0.0

        def timed() -> T:
            nonlocal began
            began = time.perf_counter()
            return fn()

        alone = self._alone if wide else _never
        result = self._budget.run(timed, alone) if self._uses_cpu_threads else timed()
        return result, began

    def _run(self, batch: Batch) -> None:
        jobs = batch.jobs
        kind = _KINDS[batch.access]
        if not isinstance(jobs[0].payload, _Work):
            self._run_function(jobs[0], kind)
            return
        try:
            (answers, phases), began = self._call(lambda: self._measured(jobs), wide=_wide_ok(jobs))
        except BaseException as exc:
            if len(jobs) > 1 and not isinstance(exc, torch.OutOfMemoryError):
                self._run_alone(jobs, kind)  # one request's failure must not decide the others'
                return
            error = _domain_error(exc, self.model)
            for job in jobs:
                self._settle(job, error)
            return
        self._count(batch, kind)
        self._report(kind, jobs, batch.size, began)
        self._ran(jobs, began, phases)
        for job, answer in zip(jobs, answers, strict=True):
            self._settle(job, _domain_error(answer, self.model) if isinstance(answer, BaseException) else answer)

    def _run_alone(self, jobs: list[Job], kind: JobKind) -> None:
        """Each job of a failed batch once more, by itself."""
        for job in jobs:
            try:
                (answers, phases), began = self._call(lambda job=job: self._measured([job]), wide=_wide_ok([job]))  # type: ignore[misc]
            except BaseException as exc:
                self._settle(job, _domain_error(exc, self.model))
                continue
            self._report(kind, [job], job.size, began)
            self._ran([job], began, phases)
            answer = answers[0]
            self._settle(job, _domain_error(answer, self.model) if isinstance(answer, BaseException) else answer)

    def _measured(self, jobs: list[Job]) -> tuple[list[Any], tuple[int, int, int]]:
        """The batch's answers, and its (input, infer, output) nanoseconds, measured on the thread that ran it."""
        take_phases()
        began = time.perf_counter_ns()
        answers = self._answers(jobs)
        ran = time.perf_counter_ns() - began
        into, out = take_phases()
        return answers, (into, max(0, ran - into - out), out)

    def _ran(self, jobs: list[Job], began: float, phases: tuple[int, int, int]) -> None:
        waited = tuple(max(0, int((began - job.enqueued) * 1e9)) for job in jobs)
        self.statistics.ran(BatchTiming(sum(job.size for job in jobs), waited, *phases))

    def _settle(self, job: Job, answer: Any) -> None:
        """Answer a model-running job (its outcome counted unless its waiter gave up and counted it)."""
        failed = isinstance(answer, BaseException)
        if not job.abandoned:  # else its waiter counted it failed when it gave up
            self.statistics.answered(not failed, _since(job))
        if failed:
            job.future.set_exception(answer)
        else:
            job.future.set_result(answer)

    def _answers(self, jobs: list[Job]) -> list[Any]:
        works: list[_Work] = [job.payload for job in jobs]
        runner = works[0].runner
        inputs, requests = [w.inputs for w in works], [w.request for w in works]
        packs = self.model.conv_packs
        if not runner.hooked:
            with packs.active() if packs is not None and self.model.predictions_packed else nullcontext():
                return runner.run(self.model, inputs, requests)
        with (
            self._lane() as model,
            stop_when_abandoned(model.module, jobs),
            packs.active() if packs is not None else nullcontext(),
        ):
            return runner.run(model, inputs, requests)

    @contextmanager
    def _lane(self) -> Iterator[LoadedModel]:
        """The model as a hooked batch sees it: its module one free lane (the eager module when it has none).

        The scheduler starts at most one HOOKED batch per lane, so a free one is always there."""
        if not self.model.lanes:
            yield self.model
            return
        with self._running_lock:
            lane = self._free_lanes.pop()
        try:
            yield replace(self.model, module=lane)
        finally:
            with self._running_lock:
                self._free_lanes.append(lane)

    def _run_function(self, job: Job, kind: JobKind) -> None:
        fn: Callable[[], Any] = job.payload
        try:
            result, began = self._call(fn)
        except BaseException as exc:
            job.future.set_exception(_domain_error(exc, self.model))
            return
        if kind is JobKind.exclusive:
            self.stats.exclusive_jobs += 1
        self._report(kind, [job], 0, began)
        job.future.set_result(result)

    def _count(self, batch: Batch, kind: JobKind) -> None:
        if kind is JobKind.predict:
            self.stats.batches += 1
            self.stats.batched_samples += batch.size
        elif kind is JobKind.exclusive:
            self.stats.hooked_batches += 1
            self.stats.exclusive_jobs += len(batch.jobs)

    def _report(self, kind: JobKind, jobs: list[Job], samples: int, began: float) -> None:
        if self._on_job is not None:
            waited = tuple(max(0.0, began - j.enqueued) for j in jobs)
            self._on_job(JobRecord(self.model.name, kind, samples, waited, time.perf_counter() - began))


def _plan_builder_thread(model_name: str) -> None:
    """Set up the thread that builds a model's capture plans: named after the model, on one core (the requests served
    meanwhile keep the others)."""
    name_os_thread(plan_name(model_name))
    pin_torch_threads(1)


def _plans_refusal(model: LoadedModel) -> str:
    """Why the model's captures never run on ONNX Runtime ("" when they may): plans follow its predictions."""
    if model.prediction_path == "onnxruntime":
        return ""
    why = model.prediction_path_reason or f"they run on the {model.prediction_path} path"
    return f"predictions do not run on ONNX Runtime ({why})"


def _never() -> bool:
    return False


def _since(job: Job) -> int:
    """Nanoseconds since `job` entered the queue."""
    return max(0, int((time.perf_counter() - job.enqueued) * 1e9))


def _wide_ok(jobs: list[Job]) -> bool:
    works: list[_Work] = [job.payload for job in jobs]
    return works[0].runner.short(works[0].request)


class JobAbandoned(Exception):
    """Every request of a running batch was given up on: the batch stops at its next forward."""


@contextmanager
def stop_when_abandoned(module: torch.nn.Module, jobs: list[Job]) -> Iterator[None]:
    """Check, before each forward of the module (Captum's internal ones included), that someone still waits."""

    def check(module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        if all(job.abandoned for job in jobs):
            raise JobAbandoned(f"all {len(jobs)} requests of this batch were given up on")

    with HookScope(module) as scope:
        scope.add(module.register_forward_pre_hook(check))
        yield


def _domain_error(exc: BaseException, model: LoadedModel) -> BaseException:
    """Device OOM becomes a 503 (caches released); domain errors pass; anything else is logged."""
    if isinstance(exc, torch.OutOfMemoryError):
        release_device_memory(model.device)
        return Unavailable(f"device out of memory running {model.name}; retry with fewer inputs", retry_after=2)
    if isinstance(exc, JobAbandoned):
        log.info("stopped an abandoned batch on %s", model.name)
    elif not isinstance(exc, HookserveError):
        log.error("job on %s failed", model.name, exc_info=exc)
    return exc


def release_device_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    elif device.type == "mps":
        torch.mps.empty_cache()
