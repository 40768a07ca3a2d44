"""The CPU thread budget: a job alone gets every core on the wide thread, jobs under load one each."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import torch

from service.runtime.threads import ThreadBudget, pin_torch_threads


@pytest.fixture
def budget() -> Iterator[ThreadBudget]:
    b = ThreadBudget(total=2, max_per_job=2)
    yield b
    b.close()


def _where() -> tuple[str, int]:
    return threading.current_thread().name, torch.get_num_threads()


def test_a_job_alone_runs_wide_on_the_one_wide_thread(budget: ThreadBudget) -> None:
    assert budget.run(_where, lambda: True) == ("hookserve-wide", 2)
    assert budget.free == 2


def test_a_job_under_load_runs_on_its_own_thread_with_one_thread(budget: ThreadBudget) -> None:
    result: list[tuple[str, int]] = []

    def worker() -> None:
        pin_torch_threads(1)
        result.append(budget.run(_where, lambda: False))

    t = threading.Thread(target=worker, name="worker")
    t.start()
    t.join()
    assert result == [("worker", 1)]


def test_pinning_survives_other_threads_changing_the_default(budget: ThreadBudget) -> None:
    seen: list[int] = []
    pinned, changed = threading.Event(), threading.Event()

    def worker() -> None:
        pin_torch_threads(1)
        pinned.set()
        changed.wait()
        seen.append(torch.get_num_threads())

    t = threading.Thread(target=worker)
    t.start()
    pinned.wait()
    torch.set_num_threads(2)  # the process-wide default, as a careless caller would
    changed.set()
    t.join()
    torch.set_num_threads(1)
    assert seen == [1]
    assert budget.run(_where, lambda: True)[1] == 2


def test_errors_come_back_from_the_wide_thread(budget: ThreadBudget) -> None:
    def boom() -> None:
        raise ValueError("inside")

    with pytest.raises(ValueError, match="inside"):
        budget.run(boom, lambda: True)
    assert budget.free == 2


def test_never_more_threads_in_use_than_the_total(budget: ThreadBudget) -> None:
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
