"""Model loads, each on its own daemon thread, so one that hangs never delays another.

A Python thread cannot be stopped: a load that is given up (it ran past its deadline, or
its model was removed) is *abandoned*. Its future fails at once with the reason; when the
thread finishes, whatever it built is dropped instead of delivered, and until then it counts
in `Loads.abandoned_running`. Daemon threads: shutdown does not wait for a hung load.

The interpreter's exit waits a little, though: a daemon thread still inside torch's C++ code
when Python finalizes is torn down by `pthread_exit`, whose unwinding through torch's
GIL-releasing frames aborts the process ("terminate called without an active exception").
So at exit each load still running gets up to its `exit_wait_s` to finish.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from service.errors import ModelLoadError
from service.runtime.os_threads import load_name, name_os_thread
from service.runtime.threads import pin_torch_threads

T = TypeVar("T")
log = logging.getLogger("hookserve.registry")

_running: dict[threading.Thread, float] = {}  # every load's thread still running -> how long exit waits for it
_running_lock = threading.Lock()


@atexit.register
def _wait_for_loads_at_exit() -> None:
    """Runs before daemon threads are torn down: give each running load its `exit_wait_s` (all at once)."""
    start = time.monotonic()
    with _running_lock:
        waits = list(_running.items())
    for thread, wait_s in waits:
        thread.join(max(0.0, start + wait_s - time.monotonic()))


class Load(Generic[T]):
    """One load running on its thread; `future` (on the event loop) gets its result or its failure."""

    def __init__(self, name: str, future: asyncio.Future[T], loads: Loads) -> None:
        self.name = name
        self.future = future
        self._loads = loads
        self.abandoned = False
        self.finished = False  # the thread's work returned or raised (guarded by the Loads lock)

    def abandon(self, reason: str) -> None:
        """Give the load up (call on the event loop): its future fails with `reason`, its result is never delivered."""
        with self._loads.lock:
            if self.abandoned:
                return
            self.abandoned = True
            if not self.finished:
                self._loads.abandoned_loads.add(self)
        if not self.future.done():
            self.future.set_exception(ModelLoadError(reason))


class Loads:
    """Starts loads; counts the abandoned ones whose thread still runs.

    `exit_wait_s`: how long the interpreter's exit waits for each of these loads still running.
    """

    def __init__(self, exit_wait_s: float = 0.0) -> None:
        self.lock = threading.Lock()
        self.abandoned_loads: set[Load[Any]] = set()
        self.exit_wait_s = exit_wait_s

    @property
    def abandoned_running(self) -> int:
        with self.lock:
            return len(self.abandoned_loads)

    def start(self, name: str, work: Callable[[], T]) -> Load[T]:
        """Run `work` on a new daemon thread (one torch thread); call on the event loop."""
        loop = asyncio.get_running_loop()
        load: Load[T] = Load(name, loop.create_future(), self)

        def run() -> None:
            name_os_thread(load_name(name))
            pin_torch_threads(1)  # loads run beside the executors: never more than one intra-op thread
            outcome: tuple[T | None, BaseException | None]
            try:
                outcome = (work(), None)
            except Exception as exc:  # delivered to the loop, which reports it
                outcome = (None, exc)
            except BaseException as exc:  # SystemExit in a model's code must not reach (and stop) the event loop
                outcome = (None, ModelLoadError(f"the load raised {type(exc).__name__}: {exc}"))
            self._finish(load, loop, *outcome)
            with _running_lock:
                _running.pop(threading.current_thread(), None)

        thread = threading.Thread(target=run, name=f"hookserve-load-{name}", daemon=True)
        with _running_lock:
            _running[thread] = self.exit_wait_s
        thread.start()
        return load

    def _finish(
        self, load: Load[T], loop: asyncio.AbstractEventLoop, result: T | None, error: BaseException | None
    ) -> None:
        with self.lock:
            load.finished = True
            abandoned = load.abandoned
            self.abandoned_loads.discard(load)
        if abandoned:  # its model goes with its last reference here
            log.info("an abandoned load of %s finished; its result is discarded", load.name)
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits for this load any more
            loop.call_soon_threadsafe(_settle, load.future, result, error)


def _settle(future: asyncio.Future[T], result: T | None, error: BaseException | None) -> None:
    if future.done():  # abandoned (or cancelled) meanwhile
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)  # type: ignore[arg-type]
