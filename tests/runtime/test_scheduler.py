"""The scheduler's order: oldest startable job first, no overtaking of a conflicting older job, batches of like jobs."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Hashable
from concurrent.futures import Future
from typing import Any

import pytest

from service.errors import Unavailable
from service.runtime.scheduler import Access, Batch, Job, Scheduler
from tests.helpers.waiting import wait_until

FAST, SHARED, EXCLUSIVE, READ = Access.FAST, Access.EAGER_SHARED, Access.EAGER_EXCLUSIVE, Access.READ
HOOKED = Access.HOOKED
_ids = itertools.count()


def job(access: Access, key: Hashable | None = None, size: int = 1, kind: str = "k") -> Job:
    return Job(Future(), access, key, size, kind, payload=next(_ids))


def scheduler(max_jobs: int = 100, max_batch: int = 8, delay_s: float = 0.0, lanes: int = 0) -> Scheduler:
    return Scheduler(max_jobs, max_batch, delay_s, lanes=lanes)


def take(s: Scheduler) -> Batch | None:
    return s.take(block=False)


def ids(batch: Batch | None) -> list[Any]:
    assert batch is not None
    return [j.payload for j in batch.jobs]


def test_like_access_runs_in_arrival_order() -> None:
    s = scheduler()
    jobs = [job(EXCLUSIVE) for _ in range(3)]
    for j in jobs:
        s.put(j)
    for j in jobs:
        batch = take(s)
        assert ids(batch) == [j.payload]
        assert take(s) is None  # the eager module is held until done
        assert batch is not None
        s.done(batch)


def test_predictions_on_the_fast_path_pass_a_running_hooked_batch() -> None:
    s = scheduler()
    hooked, later_hooked, prediction = job(EXCLUSIVE), job(EXCLUSIVE), job(FAST, key="p")
    for j in (hooked, later_hooked, prediction):
        s.put(j)
    first = take(s)
    assert ids(first) == [hooked.payload]
    assert ids(take(s)) == [prediction.payload]  # no conflict: it does not wait for the hooked jobs
    assert take(s) is None  # the second hooked job waits for the first
    assert first is not None
    s.done(first)
    assert ids(take(s)) == [later_hooked.payload]


def test_shared_predictions_do_not_overtake_an_older_hooked_job() -> None:
    """Phase-fair: a prediction that arrives after a waiting hooked job waits for it."""
    s = scheduler()
    reader, writer, late_reader = job(SHARED, key="p"), job(EXCLUSIVE), job(SHARED, key="q")
    s.put(reader)
    running = take(s)
    assert ids(running) == [reader.payload]
    s.put(writer)
    s.put(late_reader)
    assert take(s) is None  # the writer waits for the reader; the late reader may not pass the writer
    assert running is not None
    s.done(running)
    hooked = take(s)
    assert ids(hooked) == [writer.payload]
    assert take(s) is None
    assert hooked is not None
    s.done(hooked)
    assert ids(take(s)) == [late_reader.payload]


def test_hooked_batches_take_one_lane_each_beside_shared_predictions() -> None:
    s = scheduler(lanes=2)
    first, second, third, prediction = job(HOOKED), job(HOOKED), job(HOOKED), job(SHARED, key="p")
    for j in (first, second, third, prediction):
        s.put(j)
    one, two = take(s), take(s)
    assert [ids(one), ids(two)] == [[first.payload], [second.payload]]  # both lanes busy at once
    assert ids(take(s)) == [prediction.payload]  # the served module holds no lane's hooks: it passes
    assert take(s) is None  # the third waits for a free lane
    assert one is not None
    s.done(one)
    assert ids(take(s)) == [third.payload]


def test_work_on_the_served_module_alone_waits_for_the_lanes_and_holds_them_back() -> None:
    """A summary (EAGER_EXCLUSIVE) starts once no lane runs, and later hooked jobs wait for it."""
    s = scheduler(lanes=2)
    hooked, summary, later = job(HOOKED), job(EXCLUSIVE), job(HOOKED)
    s.put(hooked)
    running = take(s)
    s.put(summary)
    s.put(later)
    assert take(s) is None  # the summary waits for the lane; the later hooked job may not pass it
    assert running is not None
    s.done(running)
    alone = take(s)
    assert ids(alone) == [summary.payload]
    assert take(s) is None
    assert alone is not None
    s.done(alone)
    assert ids(take(s)) == [later.payload]


def test_reads_never_wait() -> None:
    s = scheduler()
    s.put(job(EXCLUSIVE))
    s.put(job(EXCLUSIVE))
    s.put(read := job(READ))
    assert take(s) is not None
    assert ids(take(s)) == [read.payload]


def test_like_jobs_share_a_batch_up_to_its_size_others_do_not() -> None:
    s = scheduler(max_batch=4)
    a = [job(FAST, key="a", size=1) for _ in range(3)]
    b = job(FAST, key="b")
    big = job(FAST, key="a", size=2)
    alone = job(EXCLUSIVE, key=None)
    for j in (a[0], b, a[1], big, a[2], alone):
        s.put(j)
    assert ids(take(s)) == [a[0].payload, a[1].payload, big.payload]  # 4 samples: a[2] would overflow
    assert ids(take(s)) == [b.payload]
    assert ids(take(s)) == [a[2].payload]
    assert ids(take(s)) == [alone.payload]  # key None: never batched


def test_a_forming_batch_waits_for_its_kind_being_decoded_only() -> None:
    s = scheduler(delay_s=30.0)
    first = job(FAST, key="a", kind="predict")
    s.put(first)
    s.announce("activations")  # another kind being decoded: no reason to wait
    assert ids(take(s)) == [first.payload]
    s.announce("predict")
    second, third = job(FAST, key="a", kind="predict"), job(FAST, key="a", kind="predict")
    s.put(second)
    got: list[Batch | None] = []
    taker = threading.Thread(target=lambda: got.append(s.take()))
    taker.start()
    s.put(third)
    s.withdraw("predict")  # the announced request is queued: the batch need not wait any longer
    taker.join(timeout=20)
    assert not taker.is_alive()
    assert ids(got[0]) == [second.payload, third.payload]


def test_with_no_delay_a_forming_batch_never_waits_for_an_announced_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """`max_batch_delay_ms = 0`: the batch takes what is queued and goes, however long the announced request takes.

    The scheduler's clock is frozen, so the delay alone decides: the batch leaves at once, or (with any delay over
    zero) waits until the announced request is withdrawn, which the test does only after looking."""
    monkeypatch.setattr(
        "service.runtime.scheduler.time", type("Frozen", (), {"perf_counter": staticmethod(lambda: 0.0)})
    )
    s = scheduler(delay_s=0.0)
    first = job(FAST, key="a", kind="predict")
    s.put(first)
    s.announce("predict")
    got: list[Batch | None] = []
    taker = threading.Thread(target=lambda: got.append(s.take()))
    taker.start()
    taker.join(timeout=20)
    waited = taker.is_alive()
    s.withdraw("predict")
    taker.join(timeout=20)
    assert not waited
    assert ids(got[0]) == [first.payload]


def test_a_job_abandoned_while_a_batch_forms_is_left_out_of_it() -> None:
    """The batch waits for an announced request; meanwhile a like job comes whose client has already left: it joins
    no batch, and the one that does come joins."""
    s = scheduler(delay_s=30.0)
    first = job(FAST, key="a", kind="predict")
    s.put(first)
    s.announce("predict")
    got: list[Batch | None] = []
    taker = threading.Thread(target=lambda: got.append(s.take()))
    taker.start()
    wait_until(lambda: len(s) == 0, "the first job taken and its batch forming")
    gone, kept = job(FAST, key="a", kind="predict"), job(FAST, key="a", kind="predict")
    gone.abandon()
    s.put(gone)
    s.put(kept)
    s.withdraw("predict")
    taker.join(timeout=20)
    assert not taker.is_alive()
    assert ids(got[0]) == [first.payload, kept.payload]


def test_cancelled_jobs_never_run() -> None:
    s = scheduler()
    gone, kept = job(EXCLUSIVE), job(EXCLUSIVE)
    s.put(gone)
    s.put(kept)
    assert gone.future.cancel()
    assert ids(take(s)) == [kept.payload]
    assert len(s) == 0


def test_a_full_queue_and_a_closed_one_refuse() -> None:
    s = scheduler(max_jobs=2)
    s.put(job(READ))
    s.put(job(READ))
    with pytest.raises(Unavailable, match="queue full"):
        s.put(job(READ))
    s.close()
    with pytest.raises(Unavailable, match="shutting down"):
        s.put(job(READ))
    assert take(s) is not None
    assert take(s) is not None
    assert s.take() is None  # closed and drained: the workers stop


@pytest.mark.parametrize(
    ("predictions", "hooked", "lanes"),
    [(FAST, EXCLUSIVE, 0), (SHARED, EXCLUSIVE, 0), (FAST, HOOKED, 2), (SHARED, HOOKED, 1)],
)
def test_no_kind_starves_under_a_constant_stream_of_both(predictions: Access, hooked: Access, lanes: int) -> None:
    """Two workers; every step a prediction and a hooked job arrive. Every job runs, and no job is
    overtaken by more than the jobs that were running or batched with an older one when it came."""
    s = scheduler(max_jobs=10_000, max_batch=4, lanes=lanes)
    arrival: dict[int, int] = {}
    served: list[int] = []
    running: list[Batch] = []
    clock = itertools.count()
    for step in range(400):
        if step < 300:
            for access, key in ((predictions, "p"), (hooked, "h")):
                j = job(access, key=key)
                arrival[j.payload] = next(clock)
                s.put(j)
        while len(running) < 2 and (batch := take(s)) is not None:
            running.append(batch)
            served += ids(batch)
        if running:
            s.done(running.pop(0))  # the oldest running batch finishes
    assert sorted(served) == sorted(arrival)  # everything ran
    rank = {payload: i for i, payload in enumerate(sorted(arrival, key=arrival.__getitem__))}
    lateness = [i - rank[payload] for i, payload in enumerate(served)]
    assert max(lateness) <= 16  # served a few batches late at worst, not later as the stream goes on


def background(access: Access, key: Hashable | None = None) -> Job:
    found = job(access, key)
    found.background = True
    return found


def test_background_jobs_wait_for_every_interactive_job_that_can_start() -> None:
    s = scheduler(lanes=1)
    chunk, request, prediction = background(HOOKED, "b"), job(HOOKED, "a"), job(FAST, "p")
    for j in (chunk, request, prediction):
        s.put(j)
    assert ids(take(s)) == [request.payload]  # the older background chunk waits
    assert ids(take(s)) == [prediction.payload]
    assert take(s) is None  # the lane is busy: the chunk starts when it is free
    s.done(Batch([request], HOOKED))
    assert ids(take(s)) == [chunk.payload]


def test_a_background_job_never_overtakes_a_conflicting_interactive_one() -> None:
    s = scheduler()
    summary, chunk = job(EXCLUSIVE), background(SHARED)
    s.put(summary)
    s.put(chunk)
    first = take(s)
    assert ids(first) == [summary.payload]
    assert take(s) is None  # the eager module is held alone
    assert first is not None
    s.done(first)
    assert ids(take(s)) == [chunk.payload]


def test_background_jobs_batch_with_each_other_after_the_interactive_job() -> None:
    s = scheduler(lanes=2)
    chunks = [background(HOOKED, ("activations", True)) for _ in range(2)]
    request = job(HOOKED, ("activations", False))  # the executor keys background work apart
    for j in (*chunks, request):
        s.put(j)
    assert ids(take(s)) == [request.payload]
    assert ids(take(s)) == [c.payload for c in chunks]
