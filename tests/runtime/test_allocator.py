"""MemoryReturner: trims once finished requests' estimates or the process's measured growth pass the threshold, only
when idle, never two at once."""

from __future__ import annotations

import threading

from service.runtime.allocator import MemoryReturner, find_malloc_trim
from tests.helpers.resident import Resident
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


def test_without_a_measure_trims_once_the_freed_estimates_pass_the_threshold_and_nothing_is_in_flight() -> None:
    trim = FakeTrim()
    returner = MemoryReturner(100, trim, resident=lambda: None)  # no measure: the estimates count
    assert not returner.freed(60, idle=True)  # under the threshold
    assert not returner.freed(60, idle=False)  # over it, but another request still runs
    assert returner.freed(1, idle=True)
    wait_until(lambda: returner.trims == 1, "the trim to finish")
    assert trim.calls == 1
    assert not returner.freed(99, idle=True)  # the count starts again after a trim


def test_a_running_trim_is_not_started_again() -> None:
    hold = threading.Event()
    trim = FakeTrim(hold)
    returner = MemoryReturner(10, trim, resident=lambda: None)
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


def test_measured_growth_trims_when_it_passes_the_threshold_though_the_estimates_do_not() -> None:
    trim, resident = FakeTrim(), Resident(1000)
    returner = MemoryReturner(100, trim, resident=resident)
    resident.now += 150  # a request estimated at 10 grew the process by 150
    assert not returner.freed(10, idle=False)  # another request still runs
    assert returner.freed(10, idle=True)
    wait_until(lambda: returner.trims == 1, "the trim to finish")
    resident.now = 1060  # the trim gave back most of it: growth now counts from here
    assert not returner.freed(10, idle=True)
    resident.now = 1060 + 99
    assert not returner.freed(10, idle=True)  # 99 grown, 20 estimated
    resident.now = 1060 + 100
    assert returner.freed(1, idle=True)
    wait_until(lambda: returner.trims == 2, "the second trim to finish")
    assert returner.freed(100, idle=True)  # estimates over the threshold still trim when growth is small
