"""Where the CPU goes on a shared machine: whole-machine busy time, per-process CPU, idle wait.

The benchmark shares the cores with the server it measures and with anything else on the
box, so every point records who used the CPU during its window (psutil, /proc/stat).
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import platform
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import psutil

from service.runtime import os_threads

QUIET_CORES = 0.10  # the machine counts as idle below this many busy cores over one window
NOISY_CORES = 0.12  # CPU used by others during a point above this flags the point as noisy
PACKAGES = ("torch", "torchvision", "fastapi", "uvicorn", "starlette", "httpx", "pillow", "numpy", "orjson")


def busy_seconds() -> float:
    """Busy CPU seconds of the whole machine since boot (everything but idle and iowait)."""
    t = psutil.cpu_times()
    # guest time is already inside user/nice on Linux, so it is not added again
    extra = sum(getattr(t, name, 0.0) for name in ("nice", "irq", "softirq", "steal"))
    return float(t.user + t.system + extra)


def process_cpu_seconds(pids: Iterable[int]) -> dict[int, float]:
    """User + system CPU seconds of each process (and its children that ended); NaN once gone."""
    out: dict[int, float] = {}
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            out[pid] = float(t.user + t.system + t.children_user + t.children_system)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            out[pid] = float("nan")
    return out


# What the server's threads do, by the name each gives itself (service.runtime.os_threads); the main thread
# runs the event loop, and any other thread (the threadpool of sync routes, torch's own) counts as "other".
ROLES = (
    (os_threads.RUN, "model"),
    (os_threads.WIDE, "model"),
    (os_threads.DECODE, "decode"),
    (os_threads.LOAD, "other"),
    (os_threads.TRIM, "other"),
)
EVENT_LOOP = "event loop"
ROLE_ORDER = ("model", "decode", EVENT_LOOP, "other")


def thread_role(name: str, is_main: bool) -> str:
    if is_main:
        return EVENT_LOOP
    return next((role for prefix, role in ROLES if name.startswith(prefix)), "other")


def thread_cpu_seconds(pid: int) -> dict[str, float]:
    """User + system CPU seconds of a process's live threads, summed by role (`thread_role`); {} off Linux.

    A thread that ended meanwhile takes its time with it, so compare two readings only of a process whose
    threads live on (the server's do)."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out: dict[str, float] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended between listing and reading
            continue
        role = thread_role(name, tid == str(pid))
        out[role] = out.get(role, 0.0) + (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return out


@dataclass(frozen=True)
class CpuWindow:
    """CPU use of one measured window, in cores (CPU seconds per wall second)."""

    wall_s: float
    machine_cores: float
    self_cores: float
    watched_cores: dict[int, float]
    roles_s: dict[str, float] = field(default_factory=dict)  # CPU seconds of the first watched process, by role

    @property
    def other_cores(self) -> float:
        """Busy cores not charged to this process or the watched ones (kernel, other processes)."""
        watched = sum(v for v in self.watched_cores.values() if not math.isnan(v))
        return max(0.0, self.machine_cores - self.self_cores - watched)


class CpuMeter:
    """Start/stop accounting of this process, some watched PIDs and the whole machine."""

    def __init__(self, watch: Iterable[int] = ()) -> None:
        self.watch = list(watch)
        self._t0 = self._busy0 = self._self0 = 0.0
        self._w0: dict[int, float] = {}
        self._roles0: dict[str, float] = {}

    def start(self) -> None:
        self._w0 = process_cpu_seconds(self.watch)
        self._roles0 = thread_cpu_seconds(self.watch[0]) if self.watch else {}
        self._self0 = time.process_time()
        self._busy0 = busy_seconds()
        self._t0 = time.perf_counter()

    def stop(self) -> CpuWindow:
        wall = time.perf_counter() - self._t0
        busy = busy_seconds() - self._busy0
        mine = time.process_time() - self._self0
        w1 = process_cpu_seconds(self.watch)
        roles1 = thread_cpu_seconds(self.watch[0]) if self.watch else {}
        roles = {role: max(0.0, s - self._roles0.get(role, 0.0)) for role, s in roles1.items()}
        span = wall if wall > 0 else float("nan")
        watched = {p: (w1[p] - self._w0[p]) / span for p in self.watch}
        return CpuWindow(wall, busy / span, mine / span, watched, roles)


def wait_idle(
    max_wait_s: float = 300.0,
    window_s: float = 2.0,
    threshold: float = QUIET_CORES,
    log: Callable[[str], None] = print,
) -> float:
    """Wait until fewer than `threshold` cores are busy over one `window_s`; returns that window's cores.

    Gives up after `max_wait_s` (and says so): a benchmark must end even on a busy machine.
    """
    deadline = time.monotonic() + max_wait_s
    warned = False
    while True:
        b0 = busy_seconds()
        time.sleep(window_s)
        cores = (busy_seconds() - b0) / window_s
        if cores < threshold:
            return cores
        if time.monotonic() > deadline:
            log(f"machine still busy ({cores:.2f} cores) after {max_wait_s:.0f} s; measuring anyway")
            return cores
        if not warned:
            log(f"machine busy ({cores:.2f} cores used by other processes); waiting for it to go idle")
            warned = True


def machine_info() -> dict[str, str | int | float]:
    """CPU model, core count, memory, kernel, and the CUDA device when there is one."""
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            found = re.search(r"model name\s*:\s*(.*)", f.read())
            if found:
                cpu = found.group(1).strip()
    except OSError:
        pass
    info: dict[str, str | int | float] = {
        "cpu": cpu,
        "cores": os.cpu_count() or 0,
        "mem_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }
    import torch

    info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    return info


def package_versions(names: Iterable[str] = PACKAGES) -> dict[str, str]:
    """Installed versions of the packages that shape the numbers."""
    out: dict[str, str] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


def run_side_by_side(
    target: Callable[..., None],
    calls: Sequence[tuple[tuple[Any, ...], dict[str, Any]]],
    *,
    watch: Sequence[int] | None,
    start_timeout: float,
    result_timeout: float,
) -> tuple[list[Any], CpuWindow]:
    """Run `target(*args, **kwargs, barrier=, out=)` once per call in spawned processes, released together.

    Each process puts one result on `out`; the CPU of `watch` (default: the processes themselves)
    is measured from the release to the last result. Every process is joined, or terminated.
    """
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(len(calls) + 1)
    out = ctx.Queue()
    procs = [
        ctx.Process(target=target, args=args, kwargs={**kwargs, "barrier": barrier, "out": out})
        for args, kwargs in calls
    ]
    for p in procs:
        p.start()
    try:
        barrier.wait(timeout=start_timeout)
        meter = CpuMeter(list(watch) if watch is not None else [p.pid for p in procs if p.pid is not None])
        meter.start()
        results = [out.get(timeout=result_timeout) for _ in procs]
        cpu = meter.stop()
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
                p.join()
    return results, cpu
