"""MemoryReturner: trims once enough finished requests' memory was freed, only when idle, never two at once."""

from __future__ import annotations

import threading

from service.runtime.allocator import MemoryReturner, find_malloc_trim
from tests.helpers.waiting import wait_until


class FakeTrim:
    def __init__(self, hold: threading.Event | None = None) -> None:
        self.calls = 0
        self.hold = hold

    def __call__(self, pad: int) -> int:
        self.calls += 1
        if self.hold is not None:
            assert self.hold.wait(30)
        return 1


def test_trims_once_the_freed_total_passes_the_threshold_and_nothing_is_in_flight() -> None:
    trim = FakeTrim()
    returner = MemoryReturner(100, trim)
    assert not returner.freed(60, idle=True)  # under the threshold
    assert not returner.freed(60, idle=False)  # over it, but another request still runs
    assert returner.freed(1, idle=True)
    wait_until(lambda: returner.trims == 1, "the trim to finish")
    assert trim.calls == 1
    assert not returner.freed(99, idle=True)  # the count starts again after a trim


def test_a_running_trim_is_not_started_again() -> None:
    hold = threading.Event()
    trim = FakeTrim(hold)
    returner = MemoryReturner(10, trim)
    assert returner.freed(10, idle=True)
    wait_until(lambda: trim.calls == 1, "the trim to start")
    assert not returner.freed(10, idle=True)
    hold.set()
    wait_until(lambda: returner.trims == 1, "the trim to finish")
    assert returner.freed(10, idle=True)
    wait_until(lambda: returner.trims == 2, "the second trim to finish")


def test_zero_never_trims() -> None:
    trim = FakeTrim()
    returner = MemoryReturner(0, trim)
    assert not returner.freed(10**12, idle=True)
    assert trim.calls == 0


def test_glibc_malloc_trim_is_found_here() -> None:
    """The project's machines run glibc (Debian); without it the returner would silently never trim."""
    trim = find_malloc_trim()
    assert trim is not None
    assert trim(0) in (0, 1)
