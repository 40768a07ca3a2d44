"""CPU threads for torch work: one budget sized to the cores, and one thread that may go wide.

Two OpenMP forwards of two threads each on two cores slow each other down many times over
(spinning barriers). So every job takes intra-op threads from one budget: a job that runs
alone (nothing else running, nothing queued) takes up to `max_per_job` threads for the
lowest latency; under load each job takes one, and as many jobs run side by side as there
are cores, the throughput optimum on a CPU.

libgomp also slows down (about 40 % for a resnet18 forward) once more OpenMP threads are
alive than there are cores: every OS thread that ever ran a parallel region with n threads
keeps a team of n - 1 workers. So exactly one thread, the `WideRunner`, ever runs torch
with several threads; every other thread is pinned to one.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any, TypeVar

import torch

from service.runtime.os_threads import DECODE, WIDE, name_os_thread

T = TypeVar("T")


def start_decode_thread() -> None:
    """A decode pool thread's start: named, and one intra-op thread (only the wide runner takes several)."""
    name_os_thread(DECODE)
    pin_torch_threads(1)


def pin_torch_threads(count: int) -> None:
    """Fix the calling OS thread's intra-op thread count for good.

    torch initialises a thread's OpenMP setting lazily, from the process-wide value last
    set by any thread; `get_num_threads` forces that first, so the value set next sticks.
    """
    torch.get_num_threads()
    torch.set_num_threads(max(1, count))


class WideRunner:
    """The one thread that runs jobs with more than one intra-op thread."""

    def __init__(self, threads: int) -> None:
        self.threads = max(1, threads)
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = queue.SimpleQueue()
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(ready,), name="hookserve-wide", daemon=True)
        self._thread.start()
        ready.wait()
        pin_torch_threads(1)  # the process-wide default for every thread created from now on

    def run(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the wide thread and wait for it (the caller holds the whole thread budget)."""
        future: Future[T] = Future()
        self._jobs.put((fn, future))
        return future.result()

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(5)

    def _serve(self, ready: threading.Event) -> None:
        name_os_thread(WIDE)  # before torch starts its OpenMP workers, which take the name of the thread they serve
        pin_torch_threads(self.threads)
        ready.set()
        while self._serve_one():
            pass

    def _serve_one(self) -> bool:
        """Run one job; False on `close`. Its own frame, so the job's result is not held while the thread waits."""
        item = self._jobs.get()
        if item is None:
            return False
        fn, future = item
        try:
            future.set_result(fn())
        except BaseException as exc:
            future.set_exception(exc)
        return True


class ThreadBudget:
    """Intra-op threads all CPU jobs of the process share; `threads()` hands a job its count."""

    def __init__(self, total: int, max_per_job: int) -> None:
        self.total = max(1, total)
        self.max_per_job = max(1, min(max_per_job, self.total))
        self._free = self.total
        self._cond = threading.Condition()
        self.wide = WideRunner(self.max_per_job) if self.max_per_job > 1 else None

    @property
    def free(self) -> int:
        return self._free

    @contextmanager
    def threads(self, alone: Callable[[], bool]) -> Iterator[int]:
        """Take threads (waiting for at least one) and give them back after.

        `alone()` is asked once threads are free: True lets the job take up to `max_per_job`,
        which it must then spend on `wide` (see `run`).
        """
        with self._cond:
            while self._free == 0:
                self._cond.wait()
            want = self.max_per_job if self._free == self.total and alone() else 1
            taken = min(want, self._free)
            self._free -= taken
        try:
            yield taken
        finally:
            with self._cond:
                self._free += taken
                self._cond.notify_all()

    def run(self, fn: Callable[[], T], alone: Callable[[], bool]) -> T:
        """Run a CPU job within the budget: on the wide thread when it may use several threads."""
        with self.threads(alone) as count:
            if count > 1 and self.wide is not None:
                return self.wide.run(fn)
            return fn()

    def close(self) -> None:
        if self.wide is not None:
            self.wide.close()
