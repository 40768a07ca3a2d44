"""Requests queued behind a held batch: the deterministic way to make a model batch (or queue) them.

A `Gated` model's forward waits while a request holding a HOLD sample runs; every request
sent meanwhile waits in the model's queue. The helper sends them one at a time, each only
once `hookserve_queue_depth` shows the one before it queued (so the queue order is known),
then opens the gate: the next batch holds exactly the queued requests, in that order.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx2
import torch
from fastapi.testclient import TestClient

from tests.helpers.metrics import queue_depth
from tests.helpers.models import HOLD, WIDTH, Gate
from tests.helpers.waiting import PATIENCE_S, wait_until

Call = Callable[[], httpx2.Response]  # what TestClient answers


@dataclass
class Held:
    """What happened: the answers in the order sent, and perf_counter times while all were queued."""

    answers: list[httpx2.Response]
    queued_by: list[float]  # per request: it was in the queue by then
    opened_after: float  # the gate opened after this, so no queued request began before it

    def least_wait(self) -> float:
        """A lower bound on the seconds the queued requests waited, together."""
        return sum(self.opened_after - t for t in self.queued_by)


def hold_rows() -> torch.Tensor:
    """One sample [1, WIDTH] that makes a `Gated` model wait for its gate."""
    x = torch.zeros(1, WIDTH)
    x[0, 0] = HOLD
    return x


def queued_behind_hold(client: TestClient, model: str, gate: Gate, hold_call: Call, calls: Sequence[Call]) -> Held:
    """Send `hold_call` (a request holding `hold_rows()`), queue `calls` behind it one by one, open the gate.

    Returns every answer of `calls`; the held request must answer 200.
    """
    assert not gate.opened.is_set(), "a gate opens once: give each held batch a fresh model and gate"
    with ThreadPoolExecutor(len(calls) + 1) as pool:
        try:
            hold = pool.submit(hold_call)
            if not gate.entered.wait(PATIENCE_S):
                raise TimeoutError(f"the held request never reached {model}'s forward: {hold.result().text}")
            futures, queued_by = [], []
            for call in calls:
                futures.append(pool.submit(call))
                wait_queued(client, model, len(futures))
                queued_by.append(time.perf_counter())
            opened_after = time.perf_counter()
        finally:
            gate.opened.set()
        held = hold.result()
        assert held.status_code == 200, held.text
        return Held([f.result() for f in futures], queued_by, opened_after)


def wait_queued(client: TestClient, model: str, jobs: int) -> None:
    """Until /metrics shows `jobs` jobs in `model`'s queue."""
    wait_until(
        lambda: queue_depth(client, model) == jobs, f"{jobs} jobs queued for {model} (hookserve_queue_depth)", 30.0
    )
