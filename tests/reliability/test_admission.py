"""Admission by cost: a request's memory is estimated from the layer shapes before any work; over a bound it
is a 413 before the forward, and requests that do not fit together wait for each other instead of piling up."""

from __future__ import annotations

import asyncio
import threading
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from fastapi import FastAPI

from tests.conftest import ClientFactory, read_binary_answer, tensor_input
from tests.helpers.serving import asgi_serving
from tests.reliability.live_server import LiveServer

MIB = 1024 * 1024

GATE_PY = '''
import threading
import torch
from torch import nn


class Gate(nn.Module):
    """A wide conv (its feature maps make captures large) whose forward can be held at a gate; counts forwards."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 64, 3, padding=1)
        self.fc = nn.Linear(64, 4)
        self.forwards = 0
        self.open = threading.Event()
        self.open.set()
        self.entered = threading.Semaphore(0)

    def forward(self, x):
        if x.is_meta:  # the server propagating shapes at another input size: not a forward to hold or count
            return self.fc(self.conv(x).mean((2, 3)))
        self.forwards += 1
        self.entered.release()
        assert self.open.wait(120), "the test never opened the gate"
        return self.fc(self.conv(x).mean((2, 3)))
'''

CONFIG = """
[[models]]
name = "gate"
source = "python"
architecture = "gate.py:Gate"
input_size = [3, 32, 32]
max_batch_size = 1
"""


def gate_client(make_client: ClientFactory, tmp_path: Path, **settings: Any) -> Any:
    (tmp_path / "gate.py").write_text(GATE_PY)
    return make_client(CONFIG, **settings)


def gate_of(client: Any) -> Any:
    return client.app.state.hookserve.fleet.ready("gate").model.module


def x(side: int = 32, n: int = 1) -> list[dict[str, Any]]:
    return [tensor_input(t) for t in torch.rand(n, 3, side, side, generator=torch.Generator().manual_seed(0))]


def test_a_request_over_the_per_request_bound_is_refused_before_any_forward(
    make_client: ClientFactory, tmp_path: Path
) -> None:
    client = gate_client(make_client, tmp_path, max_request_memory_bytes=4 * MIB)
    gate = gate_of(client)
    before = gate.forwards
    small = client.post("/activations", json={"model": "gate", "inputs": x(), "layers": ["conv"], "reduce": "mean"})
    assert small.status_code == 200, small.text
    assert gate.forwards == before + 1
    # 8 inputs of 64x64: the conv output alone is 8 * 64 * 64 * 64 * 4 B = 8 MiB, both sides captured
    big = {"model": "gate", "inputs": x(64, 8), "layers": ["*"], "capture": "both", "format": "safetensors"}
    response = client.post("/activations", json=big)
    assert response.status_code == 413, response.text
    detail = response.json()["detail"]
    assert "max_request_memory_bytes" in detail
    assert "captures" in detail  # what the memory is for
    assert "reduce" in detail  # and what to ask for instead
    assert gate.forwards == before + 1  # refused before any forward


def test_a_safetensors_answer_costs_no_copy_of_its_tensors(make_client: ClientFactory, tmp_path: Path) -> None:
    """Two 64x64 inputs, the conv's output captured: forward 4 MiB + captures 2 MiB. As npz the file is a
    2 MiB copy more and goes over a 7 MiB bound; as safetensors it is sent from the captures themselves
    and fits (and arrives whole)."""
    client = gate_client(make_client, tmp_path, max_request_memory_bytes=7 * MIB)
    body = {"model": "gate", "inputs": x(64, 2), "layers": ["conv"]}
    npz = client.post("/activations", json={**body, "format": "npz"})
    assert npz.status_code == 413, npz.text
    assert "answer 2.0 MiB" in npz.json()["detail"]
    answer = client.post("/activations", json={**body, "format": "safetensors"})
    assert answer.status_code == 200, answer.text
    tensors, _ = read_binary_answer(answer.content, "safetensors")
    assert tensors["conv:output"].shape == (2, 64, 64, 64)


def test_an_answer_over_its_limit_is_refused_before_the_forward(make_client: ClientFactory, tmp_path: Path) -> None:
    client = gate_client(make_client, tmp_path, max_binary_response_bytes=100_000, max_json_response_bytes=100_000)
    gate = gate_of(client)
    before = gate.forwards
    for fmt, setting in (("safetensors", "max_binary_response_bytes"), ("json", "max_json_response_bytes")):
        body = {"model": "gate", "inputs": x(), "layers": ["conv"], "format": fmt}
        response = client.post("/activations", json=body)
        assert response.status_code == 413, response.text
        assert setting in response.json()["detail"]
    assert gate.forwards == before


def test_a_json_answer_that_only_its_printed_numbers_would_put_over_the_limit_is_refused_before_the_forward(
    make_client: ClientFactory, tmp_path: Path
) -> None:
    """conv's 65,536 numbers take at least 262,144 bytes as JSON ("0.0," each) and about 700 KB as these values
    print: with a 500,000-byte limit the least size fits and the printed one does not, so the refusal must come from
    the most a number can take (15 bytes), before the forward, not from the encoder after it."""
    client = gate_client(make_client, tmp_path, max_json_response_bytes=500_000)
    gate = gate_of(client)
    before = gate.forwards
    body = {"model": "gate", "inputs": x(), "layers": ["conv"]}
    response = client.post("/activations", json=body)
    assert response.status_code == 413, response.text
    assert "could take 983040 bytes (15 each)" in response.json()["detail"]
    assert gate.forwards == before
    dry = client.post("/activations", json={**body, "dry_run": True}).json()
    assert (dry["admitted"], dry["refusal"][:3]) == (False, "413")
    safetensors = client.post("/activations", json={**body, "format": "safetensors"})
    assert safetensors.status_code == 200  # the advice works


def test_integrated_gradients_is_costed_by_its_rows_not_the_internal_batch(
    make_client: ClientFactory, tmp_path: Path
) -> None:
    """One input with 4 steps is 4 rows in one forward, not ig_internal_batch_size (64) of them; 64 steps, whose
    64 rows exceed the bound, run in chunks that fit it (resnet18's IG was a 413 from 62 steps at the default
    2 GiB bound); only an input whose one row does not fit is refused."""
    client = gate_client(make_client, tmp_path, max_request_memory_bytes=6 * MIB)
    # 64 rows of 32x32: the conv output alone is 64 * 64 * 32 * 32 * 4 B = 16 MiB; 4 rows: 1 MiB
    for steps, rows in ((4, 4), (64, 23)):  # 23 rows of 256 KiB (the conv output) fit within 6 MiB
        body = {"model": "gate", "inputs": x(), "method": "integrated_gradients", "steps": steps}
        planned = client.post("/saliency", json={**body, "dry_run": True}).json()
        assert planned["rows_per_forward"] == rows
        response = client.post("/saliency", json=body)
        assert response.status_code == 200, (steps, response.text)
    # one row of 192x192: the conv output alone is 64 * 192 * 192 * 4 B = 9 MiB
    body = {"model": "gate", "inputs": x(192), "method": "integrated_gradients", "steps": 4}
    assert client.post("/saliency", json=body).status_code == 413


def test_tensor_inputs_have_a_pixel_bound_like_images(make_client: ClientFactory, tmp_path: Path) -> None:
    client = gate_client(make_client, tmp_path, max_image_pixels=1000)
    response = client.post("/predict", json={"model": "gate", "inputs": x(40)})
    assert response.status_code == 413
    assert "max_image_pixels" in response.json()["detail"]
    assert client.post("/predict", json={"model": "gate", "inputs": x(16)}).status_code == 200


def serve(tmp_path: Path, **settings: Any) -> AbstractAsyncContextManager[tuple[FastAPI, httpx.AsyncClient]]:
    return asgi_serving(tmp_path, {"gate.py": GATE_PY, "models.toml": CONFIG}, **settings)


def test_requests_that_do_not_fit_together_wait_in_turn_and_a_full_wait_is_503(tmp_path: Path) -> None:
    """A budget that holds one capture at a time: the second waits for the first, the third is told to retry."""
    body = {"model": "gate", "inputs": x(64, 2), "layers": ["conv"], "format": "safetensors"}

    async def scenario() -> None:
        async with serve(tmp_path, memory_budget_bytes=12 * MIB, max_queue=1, worker_threads=2) as (app, client):
            gate = app.state.hookserve.fleet.ready("gate").model.module
            budget = app.state.hookserve.plane.budget
            gate.entered = threading.Semaphore(0)  # forget the forwards of loading
            started = gate.forwards
            gate.open.clear()
            first = asyncio.ensure_future(client.post("/activations", json=body))
            await asyncio.to_thread(gate.entered.acquire)  # the first is in its forward, holding its memory
            second = asyncio.ensure_future(client.post("/activations", json=body))
            while not budget._waiting:  # the second waits for memory, not for a worker
                await asyncio.sleep(0.01)
            third = await client.post("/activations", json=body)
            assert third.status_code == 503
            assert "retry-after" in third.headers
            assert "memory" in third.json()["detail"]
            assert gate.forwards == started + 1  # the first request's: the second has not started
            gate.open.set()
            assert (await first).status_code == 200
            assert (await second).status_code == 200
            assert budget.in_use == 0  # everything given back once answered

    asyncio.run(scenario())


@pytest.mark.slow
def test_the_issues_huge_request_is_refused_fast_and_memory_stays_bounded(tmp_path: Path) -> None:
    """64 base64 float32 inputs, every layer, both sides, safetensors on resnet18 (issue 13's first case)."""
    with LiveServer(tmp_path, None) as server:
        peak = server.peak_rss_bytes()
        tensor = torch.rand(3, 224, 224, generator=torch.Generator().manual_seed(0))
        body = {
            "model": "resnet18",
            "inputs": [tensor_input(tensor, as_b64=True)] * 64,
            "layers": ["*"],
            "capture": "both",
            "format": "safetensors",
        }
        response = httpx.post(f"{server.base_url}/activations", json=body, timeout=120)
        assert response.status_code == 413, response.text[:300]
        assert "max_request_memory_bytes" in response.json()["detail"]
        grown = server.peak_rss_bytes() - peak
        assert grown < 1024 * MIB, f"peak RSS grew by {grown / MIB:.0f} MiB"  # it captured 4.7 GB before


def test_memory_the_requests_in_flight_measurably_added_holds_back_the_next_beyond_their_estimates(
    tmp_path: Path,
) -> None:
    """The first request's estimate is small, but the process grows by the whole budget while it runs (as a request
    whose estimate was low would): the next request is told it would wait, and does, until the first is answered."""
    body = {"model": "gate", "inputs": x(32, 1), "layers": ["conv"], "format": "safetensors"}

    async def scenario() -> None:
        async with serve(tmp_path, memory_budget_bytes=12 * MIB, worker_threads=2) as (app, client):
            gate = app.state.hookserve.fleet.ready("gate").model.module
            budget = app.state.hookserve.plane.budget
            resident = [512 * MIB]
            budget.resident = lambda: resident[0]  # the process's RSS, as the test makes it grow
            gate.entered = threading.Semaphore(0)
            gate.open.clear()
            first = asyncio.ensure_future(client.post("/activations", json=body))
            await asyncio.to_thread(gate.entered.acquire)  # admitted on its estimate, now in its forward
            estimated = budget.in_use
            assert 0 < estimated < 2 * MIB
            resident[0] += 12 * MIB
            dry = (await client.post("/activations", json={**body, "dry_run": True})).json()
            assert (dry["admitted"], dry["would_wait"], dry["memory"]["in_use_bytes"]) == (True, True, 12 * MIB)
            second = asyncio.ensure_future(client.post("/activations", json=body))
            while not budget._waiting:  # it waits for memory though the estimates (2 x ~1 MiB) fit in 12 MiB
                await asyncio.sleep(0.01)
            resident[0] -= 12 * MIB
            gate.open.set()
            assert (await first).status_code == 200
            assert (await second).status_code == 200
            assert budget.in_use == 0

    asyncio.run(scenario())
