"""Jobs and the bounded per-model queue that groups prediction jobs into batches."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import torch

from service.errors import Unavailable


class JobKind(StrEnum):
    predict = "predict"  # batched with other predictions, model held shared
    exclusive = "exclusive"  # registers hooks: model held exclusively
    shared = "shared"  # reads the model without hooks (metadata, stats): held shared


@dataclass(eq=False)
class BatchJob:
    """Inputs `[N, ...]` to forward as part of a batch; `post` runs on the worker on this job's output slice."""

    future: Future[Any]
    inputs: torch.Tensor
    post: Callable[[Any], Any] | None = None
    enqueued: float = field(default_factory=time.perf_counter)
    kind: JobKind = JobKind.predict

    @property
    def size(self) -> int:
        return int(self.inputs.shape[0])

    @property
    def batch_key(self) -> tuple[Any, ...]:
        return tuple(self.inputs.shape[1:]), self.inputs.dtype


@dataclass(eq=False)
class CallJob:
    """A function to run on the model: `exclusive` may register hooks, `shared` only reads."""

    future: Future[Any]
    fn: Callable[[], Any]
    kind: JobKind
    enqueued: float = field(default_factory=time.perf_counter)


Job = BatchJob | CallJob


class JobQueue:
    """FIFO with a bound; `take_batch` pulls compatible prediction jobs out of order."""

    def __init__(self, max_jobs: int) -> None:
        self._jobs: deque[Job] = deque()
        self._cond = threading.Condition()
        self._max = max_jobs
        self._closed = False

    def __len__(self) -> int:
        return len(self._jobs)

    def put(self, job: Job) -> None:
        with self._cond:
            if self._closed:
                raise Unavailable("model is shutting down", retry_after=5)
            if len(self._jobs) >= self._max:
                raise Unavailable(f"queue full ({self._max} jobs, max_queue); retry shortly", retry_after=1)
            self._jobs.append(job)
            self._cond.notify_all()

    def take(self) -> Job | None:
        """Next job, or None once closed and drained."""
        with self._cond:
            while not self._jobs:
                if self._closed:
                    return None
                self._cond.wait()
            return self._jobs.popleft()

    def take_batch(
        self, first: BatchJob, max_size: int, delay_s: float, more_coming: Callable[[], bool]
    ) -> list[BatchJob]:
        """Add queued jobs of `first`'s shape until `max_size` samples, the delay, or nothing more to wait for."""
        batch: list[BatchJob] = [first]
        size = first.size
        deadline = time.perf_counter() + delay_s
        key = first.batch_key
        with self._cond:
            while size < max_size:
                index = 0
                while index < len(self._jobs) and size < max_size:
                    job = self._jobs[index]
                    if isinstance(job, BatchJob) and job.batch_key == key and size + job.size <= max_size:
                        del self._jobs[index]
                        batch.append(job)
                        size += job.size
                    else:
                        index += 1
                remaining = deadline - time.perf_counter()
                if size >= max_size or remaining <= 0 or self._closed or not more_coming():
                    break
                self._cond.wait(remaining)
        return batch

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
