"""Work nobody waits for stops: a job past its deadline or whose client left is dropped if queued and stopped at
its next forward if running; meanwhile another model answers as usual. Counted in forwards, not timed."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from tests.conftest import tensor_input, write_lenet
from tests.reliability.live_server import LiveServer

TICKING_PY = '''
import time
from pathlib import Path

import torch
from torch import nn

LOG = Path(__file__).with_name("forwards.log")
SLOW = Path(__file__).with_name("slow")


class Ticking(nn.Module):
    """Each forward leaves a line in forwards.log (the test counts them) and, once the file `slow` exists, takes
    50 ms: the times the server measures at load stay fast, so a request passes the up-front time estimate and
    meets its deadline while it runs."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        with LOG.open("a") as log:
            log.write(f"{x.shape[0]}\\n")
        if SLOW.exists():
            time.sleep(0.05)
        return self.fc(torch.relu(self.conv(x)).mean((2, 3)))
'''

TICKING_TOML = """
[[models]]
name = "ticking"
source = "python"
architecture = "ticking.py:Ticking"
input_size = [3, 8, 8]
"""

STEPS = 256  # with an internal batch of 4: 64 forwards, over 3 s
ENV = {"HOOKSERVE_IG_INTERNAL_BATCH_SIZE": "4"}


def forwards(model_dir: Path) -> int:
    log = model_dir / "forwards.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def ig_body() -> dict[str, Any]:
    x = torch.rand(3, 8, 8, generator=torch.Generator().manual_seed(0))
    return {"model": "ticking", "inputs": [tensor_input(x)], "method": "integrated_gradients", "steps": STEPS}


def settled(model_dir: Path, bound_s: float = 30.0) -> int:
    """The forward count once it stops growing (the job ended), within a generous bound."""
    deadline = time.monotonic() + bound_s
    last = forwards(model_dir)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = forwards(model_dir)
        if now == last:
            return now
        last = now
    raise AssertionError("the job never stopped")


@contextlib.contextmanager
def start(tmp_path: Path, env: dict[str, str]) -> Iterator[LiveServer]:
    """The server, ready, with the ticking model slowed down from now on."""
    (tmp_path / "ticking.py").write_text(TICKING_PY)
    with LiveServer(tmp_path, TICKING_TOML + write_lenet(tmp_path), env=ENV | env) as server:
        (tmp_path / "slow").touch()
        yield server


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, Path]]:
    """One server (no deadline) for the tests that need none: its model dir holds the forward log."""
    model_dir = tmp_path_factory.mktemp("cancellation")
    with start(model_dir, {}) as server:
        yield server, model_dir


def test_a_job_past_its_deadline_stops_at_its_next_forward(tmp_path: Path) -> None:
    with start(tmp_path, {"HOOKSERVE_REQUEST_TIMEOUT_S": "0.5"}) as server:
        before = forwards(tmp_path)
        response = httpx.post(f"{server.base_url}/saliency", json=ig_body(), timeout=60)
        assert response.status_code == 504, response.text
        ran = settled(tmp_path) - before
        assert 1 <= ran < STEPS // 4 // 2, f"{ran} forwards ran for a request abandoned after 0.5 s"


def test_a_client_that_leaves_takes_its_job_with_it(served: tuple[LiveServer, Path]) -> None:
    server, model_dir = served
    before = forwards(model_dir)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.base_url}/saliency", json=ig_body(), timeout=0.5)
    ran = settled(model_dir) - before
    assert 1 <= ran < STEPS // 4 // 2, f"{ran} forwards ran for a client that left after 0.5 s"
    assert '"status":500' not in server.log()  # answered 499 (client closed request), not an error


def test_queued_jobs_of_clients_that_left_never_run(served: tuple[LiveServer, Path]) -> None:
    server, model_dir = served
    before = forwards(model_dir)
    threads = [
        threading.Thread(target=_leave_after, args=(f"{server.base_url}/saliency", ig_body(), 0.5)) for _ in range(6)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    ran = settled(model_dir) - before
    assert ran < STEPS // 4, f"{ran} forwards: more than one abandoned job's worth ran (6 were sent)"


def _leave_after(url: str, body: dict[str, Any], seconds: float) -> None:
    with contextlib.suppress(httpx.TimeoutException):
        httpx.post(url, json=body, timeout=seconds)


def test_another_model_answers_while_a_long_job_runs(served: tuple[LiveServer, Path]) -> None:
    """A long attribution never takes every core, so another model's prediction is not held up behind it."""
    server, tmp_path = served
    done: list[httpx.Response] = []
    long_job = threading.Thread(
        target=lambda: done.append(httpx.post(f"{server.base_url}/saliency", json=ig_body(), timeout=120))
    )
    before = forwards(tmp_path)
    long_job.start()
    while forwards(tmp_path) == before:  # the attribution has started
        time.sleep(0.02)
    png = tmp_path / "digit.png"
    png.write_bytes((Path(__file__).resolve().parents[2] / "service/zoo/samples/digit_4.png").read_bytes())
    with png.open("rb") as f:
        lenet = httpx.post(f"{server.base_url}/predict", data={"model": "lenet"}, files={"image": f}, timeout=60)
    assert lenet.status_code == 200
    still_running = not done
    long_job.join(120)
    assert still_running, "the prediction waited for the whole attribution"
    assert done[0].status_code == 200
