"""When to retry a 503 (queue full, device out of memory) and how long to wait first.

The server answers 503 before a job runs, so sending the same request again is safe. The
wait is the server's `Retry-After` when it sends one, else an exponential backoff with
jitter; either is capped by `max_delay`, and at most `max_retries` retries are made, so a
call never waits without bound. Other statuses are never retried: they would fail again.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from service.client.errors import parse_retry_after

RETRY_STATUSES = frozenset({503})


@dataclass(frozen=True)
class Retry:
    """`Retry(max_retries=5, backoff=0.25, max_delay=10.0)`: the defaults wait at most ~30 s in all.

    >>> policy = Retry(max_retries=2, backoff=0.5, max_delay=4.0, jitter=0.0)
    >>> [policy.delay(attempt, None) for attempt in (1, 2, 3)]
    [0.5, 1.0, None]
    >>> policy.delay(1, "3")  # the server's Retry-After wins over the backoff
    3.0
    >>> policy.delay(1, "60")  # but never beyond max_delay
    4.0
    """

    max_retries: int = 5
    backoff: float = 0.25
    max_delay: float = 10.0
    jitter: float = 0.1

    def __post_init__(self) -> None:
        if self.max_retries < 0 or self.backoff < 0 or self.max_delay < 0 or not 0 <= self.jitter <= 1:
            raise ValueError("Retry needs max_retries, backoff, max_delay >= 0 and jitter in [0, 1]")

    def delay(self, attempt: int, retry_after: str | None) -> float | None:
        """Seconds to wait before retry number `attempt` (1-based); None when no retry is left."""
        if attempt > self.max_retries:
            return None
        server = parse_retry_after(retry_after)
        if server is not None:
            return min(server, self.max_delay)
        base = self.backoff * 2.0 ** (attempt - 1)
        spread = base * self.jitter * (2 * random.random() - 1)  # jitter, not cryptography
        return min(max(0.0, base + spread), self.max_delay)


NO_RETRY = Retry(max_retries=0)
