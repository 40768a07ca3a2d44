"""A process-wide budget of memory for requests in flight: admission by cost, before the work.

Each model-running request states what it will hold (inputs, forward activations, captures,
graphs, its answer), estimated from the model's layer shapes before it is queued. A request
over the per-request bound is refused (413); one that fits but not now waits, first come first
served, until requests in flight give their memory back; when too many already wait, 503 with
`Retry-After`. What requests in flight hold is the larger of their estimates and what they
measurably added: the process's resident memory (Linux) above what it was when the first of them
was admitted to an idle server. So a low estimate holds back later requests by what its request
really costs; the first request to an idle server is admitted by its estimate alone. A
reservation lasts until the answer has been sent when the HTTP layer opened a
`held_until_answered` scope for the request, else until the data plane's call returns.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field

from service.errors import TooLarge, Unavailable

GIB = 1024**3

_releases: contextvars.ContextVar[list[Callable[[], None]] | None] = contextvars.ContextVar(
    "hookserve_releases", default=None
)


@dataclass(frozen=True)
class Cost:
    """What a request will hold, by part (bytes)."""

    parts: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def describe(self) -> str:
        shown = ", ".join(f"{name} {_size(size)}" for name, size in self.parts.items() if size >= 1024**2)
        return f"about {_size(self.total)}" + (f" ({shown})" if shown else "")


def _size(n: int) -> str:
    """Bytes for a person: `1.50 GiB`, `12.0 MiB`, `4.0 KiB`, `512 bytes` (a small limit never reads as 0.0 MiB)."""
    if n >= GIB:
        return f"{n / GIB:.2f} GiB"
    if n >= 1024**2:
        return f"{n / 1024**2:.1f} MiB"
    return f"{n / 1024:.1f} KiB" if n >= 1024 else f"{n} bytes"


class MemoryBudget:
    """Bytes that requests in flight may hold together; waiters are served in arrival order."""

    def __init__(
        self,
        total_bytes: int,
        per_request_bytes: int,
        max_waiting: int,
        on_release: Callable[[int, bool], object] | None = None,
        resident: Callable[[], int | None] = lambda: None,
    ) -> None:
        """`on_release(size, idle)` hears of each reservation given back (`idle`: nothing else is held);
        `resident()` reads the process's resident bytes (None: estimates only)."""
        self.total = total_bytes
        self.per_request = per_request_bytes
        self.max_waiting = max_waiting
        self.on_release = on_release
        self.resident = resident
        self.in_use = 0  # the estimates of the requests in flight
        self._idle_resident: int | None = None  # resident bytes when the first of them was admitted
        self._waiting: deque[asyncio.Future[None]] = deque()

    def check(self, cost: Cost, advice: str) -> None:
        """Refuse a request that could never be admitted: over the per-request bound or the whole budget."""
        limit, setting = min(
            (self.per_request, "max_request_memory_bytes"), (self.total, "memory_budget_bytes"), key=lambda p: p[0]
        )
        if cost.total > limit:
            raise TooLarge(
                f"this request would hold {cost.describe()} of memory, over the {_size(limit)} limit ({setting}); "
                f"{advice}"
            )

    def held(self) -> int:
        """What the requests in flight hold: their estimates, or what they measurably added when that is more."""
        if self.in_use == 0 or self._idle_resident is None:
            return self.in_use
        now = self.resident()
        return self.in_use if now is None else max(self.in_use, now - self._idle_resident)

    def would_wait(self, size: int) -> bool:
        """Whether a request of `size` bytes arriving now would wait for memory (others wait, or it does not fit)."""
        return bool(self._waiting) or not self._fits(size)

    def _fits(self, size: int) -> bool:
        return self.in_use == 0 or self.held() + size <= self.total  # `check` bounds one request by the total

    def _take(self, size: int) -> None:
        if self.in_use == 0:
            self._idle_resident = self.resident()
        self.in_use += size

    @asynccontextmanager
    async def reserve(
        self, cost: Cost, advice: str, before_waiting: Callable[[], None] | None = None
    ) -> AsyncIterator[None]:
        """Hold `cost` while the request runs (see the module docstring for how long).

        `before_waiting` runs when the request has to wait for memory (e.g. to stop announcing it
        to a forming batch that should not wait for it)."""
        self.check(cost, advice)
        await self._admit(cost.total, before_waiting)
        releases = _releases.get()
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.in_use -= cost.total
                self._wake()
                if self.on_release is not None:
                    self.on_release(cost.total, self.in_use == 0)

        if releases is not None:
            releases.append(release)  # given back once the answer is sent
        try:
            yield
        except BaseException:
            release()  # nothing will be sent from this reservation's work
            raise
        finally:
            if releases is None:
                release()

    async def _admit(self, size: int, before_waiting: Callable[[], None] | None) -> None:
        if not self.would_wait(size):
            self._take(size)
            return
        if before_waiting is not None:
            before_waiting()
        if len(self._waiting) >= self.max_waiting:
            raise Unavailable(
                f"{len(self._waiting)} requests already wait for memory (memory_budget_bytes is "
                f"{_size(self.total)}, {_size(self.in_use)} in use); retry shortly",
                retry_after=1,
            )
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append(turn)
        try:
            while True:
                await turn
                if self._waiting and self._waiting[0] is turn and self._fits(size):
                    break
                turn = self._renew(turn)
        except BaseException:
            self._remove(turn)
            raise
        self._waiting.popleft()
        self._take(size)
        self._wake()  # the next in line may fit too

    def _renew(self, old: asyncio.Future[None]) -> asyncio.Future[None]:
        new: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        index = self._waiting.index(old)
        self._waiting[index] = new
        return new

    def _remove(self, turn: asyncio.Future[None]) -> None:
        if turn in self._waiting:
            self._waiting.remove(turn)
            self._wake()

    def _wake(self) -> None:
        """Tell the first waiter to look again (it alone may be admitted next: arrival order)."""
        if self._waiting and not self._waiting[0].done():
            self._waiting[0].set_result(None)


@contextmanager
def held_until_answered() -> Iterator[list[Callable[[], None]]]:
    """Within this scope, reservations are given back only when the caller runs the releases it yields."""
    releases: list[Callable[[], None]] = []
    token = _releases.set(releases)
    try:
        yield releases
    finally:
        _releases.reset(token)
