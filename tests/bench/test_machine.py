"""bench.machine's CPU accounting of the server's threads by the role each names itself with."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

from bench.machine import EVENT_LOOP, CpuMeter, thread_cpu_seconds, thread_role
from service.runtime.os_threads import executor_name, name_os_thread

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread CPU is read from /proc")


@pytest.mark.parametrize(
    ("name", "is_main", "role"),
    [
        (executor_name("resnet18", 0)[:15], False, "model"),
        ("hs-wide", False, "model"),
        ("hs-decode", False, "decode"),
        ("hs-load-resnet18", False, "other"),
        ("python", True, EVENT_LOOP),
        ("python", False, "other"),  # the threadpool of sync code, torch's own threads
    ],
)
def test_each_thread_name_has_its_role(name: str, is_main: bool, role: str) -> None:
    assert thread_role(name, is_main) == role


def spin_as(name: str, cpu_s: float, stop: threading.Event) -> None:
    """A thread that names itself `name`, burns `cpu_s` of CPU, then stays alive (its time counted) until `stop`."""
    done = threading.Event()

    def run() -> None:
        name_os_thread(name)
        end = time.thread_time() + cpu_s
        while time.thread_time() < end:
            pass
        done.set()
        stop.wait()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(30)


@linux_only
def test_cpu_is_summed_by_role_and_the_meter_reports_the_window() -> None:
    stop = threading.Event()
    meter = CpuMeter([os.getpid()])
    meter.start()
    before = thread_cpu_seconds(os.getpid())
    try:
        spin_as(executor_name("m", 0), 0.3, stop)
        spin_as("hs-decode", 0.1, stop)
        after = thread_cpu_seconds(os.getpid())
        window = meter.stop()
    finally:
        stop.set()
    grew = {role: after.get(role, 0.0) - before.get(role, 0.0) for role in after}
    assert grew["model"] >= 0.25  # clock ticks: 10 ms apiece
    assert 0.05 <= grew["decode"] < grew["model"]
    assert EVENT_LOOP in after  # this test's own (main) thread
    assert window.roles_s["model"] == pytest.approx(grew["model"], abs=0.05)


def test_a_process_that_is_gone_has_no_threads() -> None:
    assert thread_cpu_seconds(2**22 + 12345) == {}
