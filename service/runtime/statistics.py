"""A served model's inference statistics, as Triton's statistics extension counts them (no torch here).

Every request that runs the model, from any front (REST, /v2 over HTTP or gRPC, the TorchServe
API), is counted once it is answered:

- `success` / `fail`: requests answered or failed, and their time from entering the model's queue
  to their answer (a request whose client left or whose deadline passed counts as failed);
- `queue`: the time each request waited in the queue (the batching delay included);
- `compute_input`, `compute_infer`, `compute_output`: the batch's time moving its inputs to the
  device, running the model, and bringing the outputs back and turning them into each request's
  answer; each request of a batch counts its batch's durations, as Triton does;
- per batch size, how many batches ran and those three durations once per batch (`batch_stats`);
- `inference_count` (samples answered) and `execution_count` (batches run).

The executor's worker threads measure the three compute phases with `phase`, a per-thread clock
that `to_device`, `to_cpu` and the answers' post-processing wrap their work in.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from enum import Enum


class Phase(Enum):
    input = "input"
    output = "output"


@dataclass(frozen=True)
class Duration:
    count: int = 0
    ns: int = 0

    def plus(self, ns: int, count: int = 1) -> Duration:
        return Duration(self.count + count, self.ns + max(0, ns))


@dataclass(frozen=True)
class BatchStatistics:
    batch_size: int
    compute_input: Duration = Duration()
    compute_infer: Duration = Duration()
    compute_output: Duration = Duration()


@dataclass(frozen=True)
class Statistics:
    """A snapshot of one model's counters since it was loaded."""

    last_inference_ms: int = 0  # wall clock, milliseconds since the epoch; 0 before the first
    inference_count: int = 0
    execution_count: int = 0
    success: Duration = Duration()
    fail: Duration = Duration()
    queue: Duration = Duration()
    compute_input: Duration = Duration()
    compute_infer: Duration = Duration()
    compute_output: Duration = Duration()
    batches: tuple[BatchStatistics, ...] = ()


@dataclass(frozen=True)
class BatchTiming:
    """One batch that ran: its samples, each request's wait in the queue, and the batch's three phases."""

    samples: int
    waited_ns: tuple[int, ...]
    input_ns: int
    infer_ns: int
    output_ns: int


@dataclass
class ModelStatistics:
    """Thread-safe counters of one model: workers add batches and outcomes, readers take snapshots."""

    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _now: Statistics = field(default_factory=Statistics)
    _batches: dict[int, BatchStatistics] = field(default_factory=dict)

    def ran(self, batch: BatchTiming) -> None:
        """A batch ran (whatever its requests' outcomes): queue and compute times, counts."""
        n = len(batch.waited_ns)
        with self._lock:
            s = self._now
            queue = s.queue
            for waited in batch.waited_ns:
                queue = queue.plus(waited)
            self._now = replace(
                s,
                last_inference_ms=time.time_ns() // 1_000_000,
                inference_count=s.inference_count + batch.samples,
                execution_count=s.execution_count + 1,
                queue=queue,
                compute_input=s.compute_input.plus(batch.input_ns * n, n),
                compute_infer=s.compute_infer.plus(batch.infer_ns * n, n),
                compute_output=s.compute_output.plus(batch.output_ns * n, n),
            )
            old = self._batches.get(batch.samples, BatchStatistics(batch.samples))
            self._batches[batch.samples] = BatchStatistics(
                batch.samples,
                old.compute_input.plus(batch.input_ns),
                old.compute_infer.plus(batch.infer_ns),
                old.compute_output.plus(batch.output_ns),
            )

    def answered(self, ok: bool, ns: int) -> None:
        """One request's outcome and its time from entering the queue to its answer."""
        with self._lock:
            s = self._now
            if ok:
                self._now = replace(s, success=s.success.plus(ns))
            else:
                self._now = replace(s, fail=s.fail.plus(ns))

    def snapshot(self) -> Statistics:
        with self._lock:
            batches = tuple(self._batches[size] for size in sorted(self._batches))
            return replace(self._now, batches=batches)


class _Clock(threading.local):
    def __init__(self) -> None:
        self.ns = {Phase.input: 0, Phase.output: 0}
        self.inside = False


_clock = _Clock()


@contextmanager
def phase(which: Phase) -> Iterator[None]:
    """Count the time inside as `which` on this thread (a phase inside another counts once, as the outer)."""
    if _clock.inside:
        yield
        return
    _clock.inside = True
    began = time.perf_counter_ns()
    try:
        yield
    finally:
        _clock.ns[which] += time.perf_counter_ns() - began
        _clock.inside = False


def take_phases() -> tuple[int, int]:
    """This thread's (input, output) nanoseconds since the last call; resets them."""
    found = (_clock.ns[Phase.input], _clock.ns[Phase.output])
    _clock.ns = {Phase.input: 0, Phase.output: 0}
    return found
