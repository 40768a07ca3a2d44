"""Clients under which the fault tests break things: each posts slow predictions in a loop and keeps every answer.

`check_answers` is the bar every fault must clear: no connection error, no 500, and every
answer a 200 or a JSON 503 with Retry-After.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.reliability.live_server import slow_input


@dataclass(frozen=True)
class Answer:
    status: int
    replica: str | None
    retry_after: str | None
    json: bool
    sent: float  # time.monotonic() when the request went out
    answered: float


@dataclass
class Load:
    """`clients` threads posting a `seconds`-long prediction of the slow model until `stop` is set."""

    url: str
    clients: int = 8
    seconds: float = 0.25
    max_requests: int = 4000
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    answers: list[Answer] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> Load:
        self.threads = [threading.Thread(target=self._client, daemon=True) for _ in range(self.clients)]
        for thread in self.threads:
            thread.start()
        return self

    def finish(self, timeout: float = 120.0) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout)

    def _client(self) -> None:
        body: dict[str, Any] = {"model": "slow", "inputs": [slow_input(self.seconds, fill=0.5)]}
        with httpx.Client(timeout=120) as client:
            while not self.stop.is_set() and self.count() < self.max_requests:
                sent = time.monotonic()
                try:
                    r = client.post(f"{self.url}/predict", json=body)
                except httpx.TransportError as exc:
                    with self.lock:
                        self.errors.append(repr(exc))
                    continue
                answer = Answer(
                    r.status_code,
                    r.headers.get("x-hookserve-replica"),
                    r.headers.get("retry-after"),
                    r.headers.get("content-type", "").startswith("application/json"),
                    sent,
                    time.monotonic(),
                )
                with self.lock:
                    self.answers.append(answer)

    def replicas(self, since: float = 0.0) -> set[str]:
        """Replicas that answered 200 to requests sent after `since`."""
        with self.lock:
            return {a.replica for a in self.answers if a.status == 200 and a.replica and a.sent >= since}

    def count(self, since: float = 0.0) -> int:
        """Answers to requests sent after `since`."""
        with self.lock:
            return sum(1 for a in self.answers if a.sent >= since)


def check_answers(load: Load) -> None:
    """No connection errors, no 500; each answer a 200, or a JSON 503 with Retry-After."""
    assert not load.errors, f"{len(load.errors)} connection errors, e.g. {load.errors[:3]}"
    statuses = sorted({a.status for a in load.answers})
    assert 500 not in statuses, f"a client got a 500: {statuses}"
    assert set(statuses) <= {200, 503}, statuses
    bad = [a for a in load.answers if a.status == 503 and not (a.json and a.retry_after)]
    assert not bad, f"503 without JSON or Retry-After: {bad[:3]}"
