"""The service's threads carry their role in the name the OS shows (`top -H`, /proc/<pid>/task/*/comm)."""

from __future__ import annotations

import os
import sys
import threading

import pytest
import torch
from fastapi.testclient import TestClient

from service.runtime.os_threads import MAX_NAME_BYTES, executor_name, name_os_thread
from service.runtime.threads import ThreadBudget
from tests.conftest import sample_png

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread names are read from /proc")


def os_name(native_id: int) -> str:
    with open(f"/proc/self/task/{native_id}/comm") as f:
        return f.read().strip()


def os_names() -> list[str]:
    return [os_name(int(tid)) for tid in os.listdir("/proc/self/task")]


def named_in_thread(name: str) -> tuple[bool, str]:
    seen: list[tuple[bool, str]] = []

    def run() -> None:
        took = name_os_thread(name)
        seen.append((took, os_name(threading.get_native_id())))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return seen[0]


def test_a_thread_names_itself_for_the_os() -> None:
    assert named_in_thread("hs-decode") == (True, "hs-decode")


def test_a_long_name_is_cut_to_what_linux_keeps() -> None:
    name = executor_name("a_model_with_a_long_name", 1)
    took, seen = named_in_thread(name)
    assert took
    assert seen == name[:MAX_NAME_BYTES] == "hs-run1-a_model"


def test_the_running_service_threads_show_their_roles(builtin_client: TestClient) -> None:
    answer = builtin_client.post(
        "/predict", data={"model": "lenet"}, files={"image": ("3.png", sample_png(3), "image/png")}
    )
    assert answer.status_code == 200, answer.text  # a decode thread exists once an upload was decoded
    names = os_names()
    for model in ("lenet", "resnet18", "efficientvit_b0"):
        for index in (0, 1):  # the fixture runs two executor threads per model
            assert executor_name(model, index)[:MAX_NAME_BYTES] in names
    assert "hs-decode" in names


def test_the_wide_thread_and_the_openmp_workers_it_starts_carry_its_name() -> None:
    before = os_names().count("hs-wide")  # left by other tests' budgets
    budget = ThreadBudget(total=2, max_per_job=2)
    try:
        threads = budget.run(lambda: (torch.randn(4_000_000).exp().sum(), torch.get_num_threads())[1], lambda: True)
        assert threads == 2
        assert os_names().count("hs-wide") - before >= 2  # the wide thread and its OpenMP worker
    finally:
        budget.close()
