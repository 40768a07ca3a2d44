"""A process whose resident memory a test sets: for the memory budget and the trim, which read it."""

from __future__ import annotations


class Resident:
    """Callable as `resident_bytes` is; `now` is what it answers."""

    def __init__(self, start: int) -> None:
        self.now = start

    def __call__(self) -> int:
        return self.now
