"""A process-wide budget of CPU threads for torch work.

Two OpenMP forwards of two threads each on two cores slow each other down many times over
(spinning barriers). So every job takes intra-op threads from one budget sized to the
cores: a job that runs alone (nothing else running, nothing queued) takes up to
`max_per_job` threads for the lowest latency; under load each job takes one, and as many
jobs run side by side as there are cores, which is the throughput optimum on a CPU.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch


class ThreadBudget:
    def __init__(self, total: int, max_per_job: int) -> None:
        self.total = max(1, total)
        self.max_per_job = max(1, min(max_per_job, self.total))
        self._free = self.total
        self._cond = threading.Condition()

    @property
    def free(self) -> int:
        return self._free

    @contextmanager
    def threads(self, alone: Callable[[], bool]) -> Iterator[int]:
        """Take threads (waiting for at least one), set torch's intra-op count, give them back after.

        `alone()` is asked once threads are free: True lets the job take up to `max_per_job`.
        """
        with self._cond:
            while self._free == 0:
                self._cond.wait()
            want = self.max_per_job if self._free == self.total and alone() else 1
            taken = min(want, self._free)
            self._free -= taken
        try:
            if torch.get_num_threads() != taken:
                torch.set_num_threads(taken)
            yield taken
        finally:
            with self._cond:
                self._free += taken
                self._cond.notify_all()
