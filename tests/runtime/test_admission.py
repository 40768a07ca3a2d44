"""MemoryBudget on its own: what fits is admitted at once, what does not waits its turn, a waiter that gives up
leaves the line."""

from __future__ import annotations

import asyncio

import pytest

from service.runtime.admission import Cost, MemoryBudget
from tests.helpers.resident import Resident


def cost(n: int) -> Cost:
    return Cost({"inputs": n})


async def settle() -> None:
    """Let every task that can run on the loop run (admission is all on the loop, no threads)."""
    for _ in range(20):
        await asyncio.sleep(0)


def test_a_request_that_does_not_fit_beside_the_held_ones_waits_even_when_none_waits_before_it() -> None:
    async def run() -> tuple[bool, int, bool, int]:
        budget = MemoryBudget(total_bytes=10, per_request_bytes=10, max_waiting=4)
        entered = asyncio.Event()
        release_first = asyncio.Event()

        async def first() -> None:
            async with budget.reserve(cost(6), "advice"):
                await release_first.wait()

        async def second() -> None:
            async with budget.reserve(cost(6), "advice"):
                entered.set()

        holder = asyncio.ensure_future(first())
        await settle()
        waiter = asyncio.ensure_future(second())
        await settle()
        entered_while_held, in_use_while_held = entered.is_set(), budget.in_use
        release_first.set()
        await asyncio.gather(holder, waiter)
        return entered_while_held, in_use_while_held, entered.is_set(), budget.in_use

    entered_while_held, in_use_while_held, entered_after, in_use_after = asyncio.run(run())
    assert (entered_while_held, in_use_while_held) == (False, 6)
    assert (entered_after, in_use_after) == (True, 0)


def test_a_waiter_that_is_cancelled_leaves_the_line_to_those_behind_it() -> None:
    async def run() -> tuple[int, bool]:
        budget = MemoryBudget(total_bytes=10, per_request_bytes=10, max_waiting=4)
        release_first = asyncio.Event()
        small_in = asyncio.Event()

        async def hold(size: int, until: asyncio.Event) -> None:
            async with budget.reserve(cost(size), "advice"):
                await until.wait()

        async def small() -> None:
            async with budget.reserve(cost(4), "advice"):
                small_in.set()

        holder = asyncio.ensure_future(hold(6, release_first))
        await settle()
        big = asyncio.ensure_future(hold(6, asyncio.Event()))  # waits: 6 + 6 > 10
        await settle()
        big.cancel()
        with pytest.raises(asyncio.CancelledError):
            await big
        # Nobody waits now, and 6 + 4 fits: the small one must not queue behind the cancelled one.
        await asyncio.wait_for(small(), timeout=30)
        in_use = budget.in_use
        release_first.set()
        await holder
        return in_use, small_in.is_set()

    assert asyncio.run(run()) == (6, True)


def test_a_newcomer_that_would_fit_waits_behind_an_older_waiter() -> None:
    """First come, first served: a large request waiting for memory is not overtaken by smaller ones that fit
    beside what is held (else a stream of small requests would starve it)."""

    async def run() -> tuple[list[str], list[str]]:
        budget = MemoryBudget(total_bytes=10, per_request_bytes=10, max_waiting=4)
        release_first = asyncio.Event()
        entered: list[str] = []

        async def hold(name: str, size: int, until: asyncio.Event) -> None:
            async with budget.reserve(cost(size), "advice"):
                entered.append(name)
                await until.wait()

        done = asyncio.Event()
        done.set()
        holder = asyncio.ensure_future(hold("holder", 6, release_first))
        await settle()
        large = asyncio.ensure_future(hold("large", 8, done))  # 6 + 8 > 10: waits
        await settle()
        small = asyncio.ensure_future(hold("small", 3, done))  # 6 + 3 fits, but the large one came first
        await settle()
        while_held = list(entered)
        release_first.set()
        await asyncio.gather(holder, large, small)
        return while_held, entered

    while_held, entered = asyncio.run(run())
    assert while_held == ["holder"]
    assert entered == ["holder", "large", "small"]


@pytest.mark.parametrize(
    ("size", "text"),
    [(512, "512 bytes"), (4096, "4.0 KiB"), (3 * 1024**2 // 2, "1.5 MiB"), (5 * 1024**3 // 2, "2.50 GiB")],
)
def test_sizes_in_a_refusal_are_in_units_a_person_reads(size: int, text: str) -> None:
    assert Cost({"inputs": size}).describe().startswith(f"about {text}")


def test_what_the_requests_in_flight_measurably_added_holds_back_the_next_when_it_is_over_their_estimates() -> None:
    async def run() -> list[tuple[bool, int]]:
        resident = Resident(1000)
        budget = MemoryBudget(total_bytes=10, per_request_bytes=10, max_waiting=4, resident=resident)
        release = asyncio.Event()
        entered = asyncio.Event()
        seen: list[tuple[bool, int]] = []

        async def first() -> None:
            async with budget.reserve(cost(2), "advice"):  # estimated at 2; the process grows by 7 meanwhile
                resident.now += 7
                await release.wait()
                resident.now -= 7

        async def second() -> None:
            async with budget.reserve(cost(2), "advice"):  # 2 + 2 fits the estimates, 7 + 2 does, 7 + 4 would not
                entered.set()

        async def third() -> None:
            async with budget.reserve(cost(2), "advice"):
                pass

        holder = asyncio.ensure_future(first())
        await settle()
        seen.append((budget.would_wait(2), budget.held()))  # 7 measured + 2 fits in 10
        resident.now += 2  # the process grows further (another request's leftovers, a plan's build)
        waiter = asyncio.ensure_future(second())
        await settle()
        seen.append((entered.is_set(), budget.held()))  # 9 + 2 > 10: it waits, though the estimates say 2 + 2
        resident.now -= 2
        release.set()
        await asyncio.gather(holder, waiter, asyncio.ensure_future(third()))
        seen.append((entered.is_set(), budget.held()))
        return seen

    assert asyncio.run(run()) == [(False, 7), (False, 9), (True, 0)]


def test_without_a_measure_the_estimates_decide_alone() -> None:
    budget = MemoryBudget(total_bytes=10, per_request_bytes=10, max_waiting=4)
    assert budget.held() == 0
    assert not budget.would_wait(10)
