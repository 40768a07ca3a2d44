"""The process's resident memory, as the kernel counts it: what the budget and the trim measure where they can."""

from __future__ import annotations

import os

_STATM = "/proc/self/statm"
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes() -> int | None:
    """Resident set size in bytes (Linux `/proc/self/statm`; ~10 us), or None where the kernel does not say."""
    try:
        with open(_STATM, "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None
