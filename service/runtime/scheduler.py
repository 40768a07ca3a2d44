"""One model's queue and the order its jobs run in: arrival order across kinds, batches of like jobs.

The policy, in full:

- Jobs wait in one bounded FIFO. A free worker takes the *oldest* job that can start now,
  together with later jobs that can share its batch (same batch key, up to `max_batch_size`
  samples, waiting at most `max_batch_delay_ms` while more of its kind are being decoded).
- What a job needs of the model is its `Access`. Hooked work (activations, gradients,
  saliency, interventions) runs on one of the model's hook lanes (`HOOKED`: copies of the
  module sharing its weights, each with hook dicts of its own), up to `lanes` batches at once;
  a model without lanes runs it on the eager module alone (`EAGER_EXCLUSIVE`, which summaries
  and node tracing always take: no other eager work meanwhile). Predictions run on their own
  fast-path copy (`FAST`, any number at once) or, when the model has none, share the eager
  module (`EAGER_SHARED`). Reads of parameters (`READ`) need nothing.
- A job may start before an older waiting job only if the two do not conflict (one needs the
  eager module alone and the other any eager module or lane). So a stream of one kind can never
  hold another back: hooked batches run on their lanes in arrival order while predictions pass
  them on the fast path, and where work shares the eager module it queues behind an older job
  that needs it alone instead of overtaking it (phase-fair reader/writer order, not writer- or
  reader-preferring).
- Background jobs (data-set jobs' chunks) come last: a background job starts only when no
  interactive job can start now, and never overtakes a waiting interactive job it conflicts with.
  A data-set job queues one chunk at a time, so an interactive request waits for one chunk at most.

No torch here: the executor runs what this hands out (`tests/runtime/test_scheduler.py`).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Hashable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from service.errors import Unavailable


class Access(Enum):
    """What a job needs of the model while it runs."""

    READ = "read"  # parameters and metadata only: never waits for another job
    FAST = "fast"  # the fast-path copy (no hooks ever): any number at once
    EAGER_SHARED = "eager_shared"  # a plain forward on the eager module: beside other such forwards
    HOOKED = "hooked"  # hooks on one of the model's lanes: beside predictions and the other lanes
    EAGER_EXCLUSIVE = "eager_exclusive"  # hooks on the eager module itself: alone

    def conflicts(self, other: Access) -> bool:
        eager = (Access.EAGER_SHARED, Access.HOOKED, Access.EAGER_EXCLUSIVE)
        return self in eager and other in eager and Access.EAGER_EXCLUSIVE in (self, other)


@dataclass(eq=False)
class Job:
    """One request's work. `key` None: runs alone; else jobs with equal keys may share one batch."""

    future: Future[Any]
    access: Access
    key: Hashable | None = None
    size: int = 1  # samples, counted against max_batch_size
    kind: str = ""  # what it is (predict, hooked, shared...), for metrics and the announcements
    payload: Any = None  # what the executor needs to run it
    enqueued: float = field(default_factory=time.perf_counter)
    left: bool = False  # its waiter gave up (deadline, or the client went away)
    background: bool = False  # low priority: runs only when no interactive job can start

    @property
    def abandoned(self) -> bool:
        """Nobody waits for the answer any more: a queued one never runs, a running one stops at its next forward."""
        return self.left or self.future.cancelled()

    def abandon(self) -> None:
        self.left = True
        self.future.cancel()  # a queued job is dropped; a running one cannot be cancelled, `left` tells it


@dataclass(eq=False)
class Batch:
    """Jobs handed to one worker together; they hold `access` until `Scheduler.done`."""

    jobs: list[Job]
    access: Access

    @property
    def size(self) -> int:
        return sum(job.size for job in self.jobs)


class Scheduler:
    """The bounded queue of one model and the access its running batches hold."""

    def __init__(self, max_jobs: int, max_batch_size: int, max_batch_delay_s: float, lanes: int = 0) -> None:
        self._jobs: deque[Job] = deque()
        self._cond = threading.Condition()
        self._max_jobs = max_jobs
        self._max_batch_size = max(1, max_batch_size)
        self._delay = max(0.0, max_batch_delay_s)
        self._closed = False
        self._eager_readers = 0
        self._eager_writer = False
        self._lanes = lanes
        self._hooked = 0  # lanes in use
        self._incoming: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._jobs)

    @property
    def quiet(self) -> bool:
        """Nothing queued and nothing being decoded for this model."""
        return not self._jobs and not any(self._incoming.values())

    # ---- submission ------------------------------------------------------------------------
    def put(self, job: Job) -> None:
        with self._cond:
            if self._closed:
                raise Unavailable("model is shutting down", retry_after=5)
            if len(self._jobs) >= self._max_jobs:
                raise Unavailable(f"queue full ({self._max_jobs} jobs, max_queue); retry shortly", retry_after=1)
            self._jobs.append(job)
            self._cond.notify_all()

    def announce(self, kind: str) -> None:
        """A request of `kind` is being decoded: a forming batch of that kind may wait for it."""
        with self._cond:
            self._incoming[kind] = self._incoming.get(kind, 0) + 1

    def withdraw(self, kind: str) -> None:
        """The announced request was queued, or failed to decode."""
        with self._cond:
            self._incoming[kind] = max(0, self._incoming.get(kind, 0) - 1)
            self._cond.notify_all()

    def discard(self, job: Job) -> bool:
        """Drop a queued job (its client left); False when it already started or was never queued."""
        with self._cond:
            try:
                self._jobs.remove(job)
            except ValueError:
                return False
            self._cond.notify_all()
            return True

    # ---- the workers' side -----------------------------------------------------------------
    def take(self, *, block: bool = True) -> Batch | None:
        """The next batch to run, holding its access; None once closed and drained (or, without
        `block`, when nothing can start now)."""
        with self._cond:
            while True:
                self._drop_abandoned()
                first = self._startable()
                if first is not None:
                    break
                if (self._closed and not self._jobs) or not block:
                    return None
                self._cond.wait()
            self._jobs.remove(first)
            self._acquire(first.access)
            return Batch(self._fill([first], self._max_batch_size), first.access)

    def done(self, batch: Batch) -> None:
        """Release what the batch held."""
        with self._cond:
            if batch.access is Access.EAGER_EXCLUSIVE:
                self._eager_writer = False
            elif batch.access is Access.EAGER_SHARED:
                self._eager_readers -= 1
            elif batch.access is Access.HOOKED:
                self._hooked -= 1
            self._cond.notify_all()

    def close(self) -> None:
        """No new jobs; `take` returns None once the queued ones are handed out."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def drain(self) -> list[Job]:
        """Remove and return every queued job (shutdown past its grace)."""
        with self._cond:
            jobs = list(self._jobs)
            self._jobs.clear()
            self._cond.notify_all()
            return jobs

    # ---- policy ---------------------------------------------------------------------------
    def _startable(self) -> Job | None:
        """The oldest interactive job that can start now without overtaking an older interactive job it
        conflicts with; else the oldest job at all that can (background jobs overtake no conflicting job)."""
        first = self._oldest_startable([job for job in self._jobs if not job.background])
        if first is None and any(job.background for job in self._jobs):
            first = self._oldest_startable(self._jobs)
        return first

    def _oldest_startable(self, jobs: Sequence[Job] | deque[Job]) -> Job | None:
        waiting: list[Access] = []
        for job in jobs:
            if self._can_start(job.access) and not any(job.access.conflicts(w) for w in waiting):
                return job
            waiting.append(job.access)
        return None

    def _can_start(self, access: Access) -> bool:
        if access is Access.EAGER_EXCLUSIVE:
            return not self._eager_writer and self._eager_readers == 0 and self._hooked == 0
        if access is Access.EAGER_SHARED:
            return not self._eager_writer
        if access is Access.HOOKED:
            return not self._eager_writer and self._hooked < self._lanes
        return True

    def _acquire(self, access: Access) -> None:
        if access is Access.EAGER_EXCLUSIVE:
            self._eager_writer = True
        elif access is Access.EAGER_SHARED:
            self._eager_readers += 1
        elif access is Access.HOOKED:
            self._hooked += 1

    def _fill(self, batch: list[Job], limit: int) -> list[Job]:
        """Add queued jobs with the first one's key until `limit` samples, the delay, or nothing more coming."""
        first = batch[0]
        if first.key is None:
            return batch
        size = first.size
        deadline = time.perf_counter() + self._delay
        while size < limit:
            for job in self._matching(first.key, limit - size):
                self._jobs.remove(job)
                batch.append(job)
                size += job.size
            remaining = deadline - time.perf_counter()
            if size >= limit or remaining <= 0 or self._closed or not self._incoming.get(first.kind, 0):
                break
            self._cond.wait(remaining)
        return batch

    def _matching(self, key: Hashable, room: int) -> Sequence[Job]:
        found: list[Job] = []
        for job in self._jobs:
            if job.key == key and not job.abandoned and job.size <= room:
                found.append(job)
                room -= job.size
        return found

    def _drop_abandoned(self) -> None:
        """Jobs whose futures were cancelled never run (their client left or their deadline passed)."""
        if any(job.abandoned for job in self._jobs):
            kept = [job for job in self._jobs if not job.abandoned]
            self._jobs.clear()
            self._jobs.extend(kept)
