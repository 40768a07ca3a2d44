"""The names the operating system shows for the service's threads (`top -H`, `ps -L`, perf, /proc).

Python's thread names stay inside Python (3.11 does not pass them on), so every thread of the
service is `python` to the OS, and the intra-op workers torch starts on the wide thread too.
Each thread the service starts names itself with `name_os_thread` as it begins, with its role
first so that tools can group them (`bench.machine.thread_cpu_seconds` does):

- `hs-run<i>-<model>`: a model's executor thread i (forwards, hooks, captures);
- `hs-wide`: the one thread that runs a job alone on several intra-op threads; the OpenMP
  workers it starts inherit the name, so their time counts as the same forward's;
- `hs-decode`: the decode pool (image decoding, request parsing, large answers' encoding);
- `hs-load-<model>` and `hs-trim`: model loads and `malloc_trim`.

The main thread keeps the process's name: it runs the event loop. Linux keeps 15 bytes of a
name; longer names are cut there. Elsewhere naming does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from collections.abc import Callable

MAX_NAME_BYTES = 15  # TASK_COMM_LEN - 1
_PR_SET_NAME = 15

RUN = "hs-run"
WIDE = "hs-wide"
DECODE = "hs-decode"
LOAD = "hs-load"
TRIM = "hs-trim"
PLANS = "hs-plan"


def executor_name(model: str, index: int) -> str:
    return f"{RUN}{index}-{model}"


def load_name(model: str) -> str:
    return f"{LOAD}-{model}"


def plan_name(model: str) -> str:
    """The thread building one model's capture plans."""
    return f"{PLANS}-{model}"


def _find_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c")
    try:
        prctl: Callable[..., int] = ctypes.CDLL(name, use_errno=True).prctl
    except (OSError, AttributeError, TypeError):
        return None
    return prctl


_prctl = _find_prctl()


def name_os_thread(name: str) -> bool:
    """Give the calling thread `name` (cut to 15 bytes) in the OS; whether it took."""
    if _prctl is None:
        return False
    raw = name.encode("utf-8", "replace")[:MAX_NAME_BYTES]
    return _prctl(_PR_SET_NAME, ctypes.c_char_p(raw), 0, 0, 0) == 0
