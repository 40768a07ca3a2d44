"""`Loads`: each load on its own thread; an abandoned load fails at once, is counted until its thread ends,
and never delivers its result; the interpreter's exit lets a running load finish, a hung one only briefly."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time

import pytest

from service.errors import ModelLoadError
from service.runtime.loads import Loads
from tests.helpers.waiting import PATIENCE_S, wait_until_async
from tests.reliability.live_server import REPO_ROOT

PROMPT_S = 5.0


def test_a_blocked_load_does_not_hold_up_another() -> None:
    gate = threading.Event()

    async def scenario() -> None:
        loads = Loads()
        blocked = loads.start("blocked", lambda: gate.wait(PATIENCE_S))
        quick = loads.start("quick", lambda: 42)
        assert await asyncio.wait_for(quick.future, PROMPT_S) == 42
        assert not blocked.future.done()
        gate.set()
        assert await asyncio.wait_for(blocked.future, PATIENCE_S) is True

    try:
        asyncio.run(scenario())
    finally:
        gate.set()


def test_an_abandoned_load_fails_at_once_is_counted_until_it_ends_and_never_delivers() -> None:
    gate = threading.Event()
    returned = threading.Event()

    def work() -> str:
        gate.wait(PATIENCE_S)
        returned.set()
        return "built"

    async def scenario() -> None:
        loads = Loads()
        load = loads.start("hung", work)
        load.abandon("given up")
        with pytest.raises(ModelLoadError, match="given up"):
            await load.future
        assert loads.abandoned_running == 1
        gate.set()
        await wait_until_async(lambda: loads.abandoned_running == 0, "the abandoned thread ended")
        assert returned.is_set()
        await asyncio.sleep(0.05)  # a delivery, were there one, would be on the loop by now
        assert isinstance(load.future.exception(), ModelLoadError)

    try:
        asyncio.run(scenario())
    finally:
        gate.set()


def test_a_load_that_finished_is_not_counted_when_abandoned() -> None:
    async def scenario() -> None:
        loads = Loads()
        load = loads.start("done", lambda: 1)
        assert await load.future == 1
        load.abandon("too late")
        assert loads.abandoned_running == 0

    asyncio.run(scenario())


def test_system_exit_in_a_load_is_a_load_error_not_the_loops_end() -> None:
    def work() -> None:
        raise SystemExit(3)

    async def scenario() -> None:
        load = Loads().start("exits", work)
        with pytest.raises(ModelLoadError, match="SystemExit"):
            await load.future

    asyncio.run(scenario())


EXITING = """
import asyncio, sys, time
import torch
from service.runtime.loads import Loads

def busy() -> None:  # in torch's C++ code most of the time, as a real load is
    x = torch.ones(256, 256)
    started = time.monotonic()
    while time.monotonic() - started < 1.0:
        x = (x @ x).clamp(-1, 1)
    print("finished", flush=True)

def hung() -> None:
    time.sleep(300)

async def main() -> None:
    Loads(exit_wait_s=float(sys.argv[2])).start("load", busy if sys.argv[1] == "busy" else hung)

asyncio.run(main())
"""


def exit_with_a_load(kind: str, exit_wait_s: float) -> tuple[subprocess.CompletedProcess[str], float]:
    """A process that starts one load and exits at once (a subprocess: its exit is what is tested)."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    started = time.monotonic()
    args = [sys.executable, "-c", EXITING, kind, str(exit_wait_s)]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120, check=False)
    return done, time.monotonic() - started


def test_exit_lets_a_running_load_finish_rather_than_tear_it_down_inside_torch() -> None:
    done, _ = exit_with_a_load("busy", 60.0)
    assert done.returncode == 0, done.stderr
    assert "finished" in done.stdout
    assert "terminate" not in done.stderr


def test_exit_waits_for_a_hung_load_only_its_exit_wait_s() -> None:
    done, took = exit_with_a_load("hung", 0.5)
    assert done.returncode == 0, done.stderr
    assert took < 60  # not the load's 300 s


def test_a_load_runs_on_a_daemon_thread_so_exit_never_joins_it() -> None:
    """In process, what `test_exit_waits_for_a_hung_load_only_its_exit_wait_s` shows in a subprocess (which
    imports the repository's code, so a mutation run never sees it there): the interpreter's exit joins every
    non-daemon thread before `atexit`, so a hung load on one would hold the exit for as long as it hangs."""
    release = threading.Event()

    async def scenario() -> bool:
        load = Loads().start("daemonic", lambda: release.wait(PATIENCE_S))
        try:
            [thread] = [t for t in threading.enumerate() if t.name == "hookserve-load-daemonic"]
            return thread.daemon
        finally:
            release.set()
            await load.future

    assert asyncio.run(scenario()) is True
