"""Waiting for something to happen, with a deadline that only a failing test ever reaches."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

PATIENCE_S = 60.0  # generous: on a busy 2-core machine a model load or a request can take seconds


def wait_until(condition: Callable[[], bool], what: str, timeout: float = PATIENCE_S) -> None:
    """Poll `condition` until true; TimeoutError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout:g} s: {what}")
        time.sleep(0.005)


async def wait_until_async(condition: Callable[[], bool], what: str, timeout: float = PATIENCE_S) -> None:
    """`wait_until` on an event loop: polls without blocking it (for what the loop itself must deliver)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout:g} s: {what}")
        await asyncio.sleep(0.005)
