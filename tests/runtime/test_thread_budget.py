"""The CPU thread budget: a job alone gets every core, jobs under load one each, never more than the cores."""

from __future__ import annotations

import threading
import time

import torch

from service.runtime.threads import ThreadBudget


def test_a_job_alone_takes_up_to_max_per_job() -> None:
    budget = ThreadBudget(total=2, max_per_job=2)
    seen: list[int] = []

    def job() -> None:
        with budget.threads(lambda: True) as n:
            seen.append(n)
            seen.append(torch.get_num_threads())

    t = threading.Thread(target=job)
    t.start()
    t.join()
    assert seen == [2, 2]
    assert budget.free == 2


def test_under_load_jobs_take_one_thread_each() -> None:
    budget = ThreadBudget(total=2, max_per_job=2)
    with budget.threads(lambda: False) as n:
        assert n == 1
        assert budget.free == 1
        with budget.threads(lambda: True) as m:  # not alone: the budget is partly used
            assert m == 1
            assert budget.free == 0
    assert budget.free == 2


def test_never_more_threads_in_use_than_the_total() -> None:
    budget = ThreadBudget(total=2, max_per_job=2)
    in_use = 0
    peak = 0
    lock = threading.Lock()

    def job(alone: bool) -> None:
        nonlocal in_use, peak
        with budget.threads(lambda: alone) as n:
            with lock:
                in_use += n
                peak = max(peak, in_use)
            time.sleep(0.01)
            with lock:
                in_use -= n

    threads = [threading.Thread(target=job, args=(i % 2 == 0,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak <= 2
    assert budget.free == 2
