"""Freed memory given back to the operating system.

glibc's allocator keeps the pages of freed large tensors in its arenas (its mmap threshold
grows with every large free), so after a large request the process stays at that request's
peak; a few such requests at once leave it at several times one request's peak. `malloc_trim`
returns the free pages. `MemoryReturner` runs it, off the event loop, when nothing is in flight and
finished requests' estimates add up to `after_bytes` since the last trim, or the process's resident
memory (Linux) grew by that much since then, whichever comes first; so no trim slows a busy server,
and a request whose estimate was low still leads to a trim.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading
from collections.abc import Callable

from service.runtime.os_threads import TRIM, name_os_thread
from service.runtime.resident import resident_bytes

log = logging.getLogger("hookserve.memory")


def find_malloc_trim() -> Callable[[int], int] | None:
    """glibc's `malloc_trim(pad)`, or None where the C library has none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


class MemoryReturner:
    """Past `after_bytes` left behind since the last trim (estimated, or measured when more), when idle, trims the
    allocator once."""

    def __init__(
        self,
        after_bytes: int,
        trim: Callable[[int], int] | None = None,
        resident: Callable[[], int | None] = resident_bytes,
    ) -> None:
        """`after_bytes` 0 never trims; `trim` defaults to glibc's `malloc_trim`; `resident` reads the RSS."""
        self.after_bytes = after_bytes
        self._trim = trim if trim is not None else find_malloc_trim()
        self._resident = resident
        self._baseline = resident()  # RSS after the last trim (or at start); None: estimates only
        self._freed = 0
        self._running = False
        self._lock = threading.Lock()
        self.trims = 0  # completed trims (the tests read it)

    def freed(self, size: int, idle: bool) -> bool:
        """A request that held `size` bytes finished; `idle`: nothing else is in flight. Whether a trim started."""
        if self.after_bytes <= 0 or self._trim is None:
            return False
        with self._lock:
            self._freed += size
            if not idle or self._running or self.grown() < self.after_bytes:
                return False
            self._freed = 0
            self._running = True
        threading.Thread(target=self._run, name="memory-trim", daemon=True).start()
        return True

    def grown(self) -> int:
        """What finished requests left behind since the last trim: the larger of their estimates and the bytes the
        process grew by (resident memory, where it can be read)."""
        now = self._resident() if self._baseline is not None else None
        if now is None or self._baseline is None:
            return self._freed
        self._baseline = min(self._baseline, now)  # a model unloaded since: grow from there
        return max(self._freed, now - self._baseline)

    def _run(self) -> None:
        name_os_thread(TRIM)
        assert self._trim is not None
        try:
            self._trim(0)
        except Exception:  # a trim that fails costs memory, not correctness
            log.exception("malloc_trim failed")
        finally:
            with self._lock:
                self._running = False
                self.trims += 1
                if self._baseline is not None:
                    self._baseline = self._resident() or self._baseline
