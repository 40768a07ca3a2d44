"""The fleet over `Loads`: a load past `load_timeout_s` fails naming the setting; removing a loading model and
closing the fleet never wait for a hung load."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import cast

import pytest
import torch

from service.config import Settings
from service.runtime.fleet import Fleet, Status
from service.specs.model import ModelSpec
from tests.helpers.hanging import Gates, hanging_spec, write_hanging
from tests.helpers.held import hold_rows
from tests.helpers.models import WIDTH, new_gate
from tests.helpers.waiting import wait_until_async

PROMPT_S = 5.0  # "at once" on a busy machine, against loads that would hang for minutes


def test_the_fleet_fails_a_load_past_load_timeout_s(tmp_path: Path) -> None:
    write_hanging(tmp_path)

    async def scenario(gates: Gates) -> None:
        fleet = Fleet(Settings(model_dir=tmp_path, worker_threads=1, load_timeout_s=0.2))
        entry = fleet.add(ModelSpec.model_validate(hanging_spec("slow", gates.closed("gate"))))
        await wait_until_async(lambda: entry.status is not Status.loading, "the load timed out")
        assert entry.status is Status.failed
        assert entry.error is not None
        assert "load_timeout_s = 0.2 s" in entry.error
        assert fleet.abandoned_loads == 1
        await asyncio.wait_for(fleet.close(), PROMPT_S)

    with Gates(tmp_path) as gates:
        asyncio.run(scenario(gates))


def test_the_fleet_removes_and_closes_without_waiting_for_a_hung_load(tmp_path: Path) -> None:
    write_hanging(tmp_path)

    async def scenario(gates: Gates) -> None:
        fleet = Fleet(Settings(model_dir=tmp_path, worker_threads=1))  # the default timeout: minutes
        fleet.add(ModelSpec.model_validate(hanging_spec("removed", gates.closed("gate-removed"))))
        await asyncio.wait_for(fleet.remove("removed"), PROMPT_S)
        assert "removed" not in fleet
        fleet.add(ModelSpec.model_validate(hanging_spec("open", gates.closed("gate-open"))))
        assert fleet.abandoned_loads == 1
        await asyncio.wait_for(fleet.close(), PROMPT_S)
        assert fleet.abandoned_loads == 2

    with Gates(tmp_path) as gates:
        asyncio.run(scenario(gates))


def test_closing_the_fleet_stops_every_model_at_once_within_its_bound(tmp_path: Path) -> None:
    """Two models each with a forward held at its gate: close() returns after about `within` seconds, not after
    the shutdown grace period per model (30 s each here), while both forwards are still held."""
    keys_and_gates = [new_gate() for _ in range(2)]

    async def scenario() -> float:
        fleet = Fleet(Settings(model_dir=tmp_path, worker_threads=1, torch_threads=1, shutdown_grace_s=30.0))
        for i, (key, _) in enumerate(keys_and_gates):
            spec = {
                "name": f"held{i}",
                "source": "python",
                "architecture": "tests.helpers.models:Gated",
                "input_size": [WIDTH],
                "kwargs": {"gate": key},
            }
            fleet.add(ModelSpec.model_validate(spec))
        names = [f"held{i}" for i in range(2)]
        await wait_until_async(lambda: all(fleet.entry(n).status is Status.ready for n in names), "the models to load")
        held = [asyncio.ensure_future(fleet.ready(f"held{i}").executor.predict(hold_rows())) for i in range(2)]
        for _, gate in keys_and_gates:
            await wait_until_async(gate.entered.is_set, "the held forward to start")
        began = time.monotonic()
        await fleet.close()  # CLOSE_WITHIN_S, for both models together
        took = time.monotonic() - began
        assert not any(gate.opened.is_set() for _, gate in keys_and_gates)
        for task in held:
            task.cancel()
        return took

    try:
        took = asyncio.run(scenario())
    finally:
        for _, gate in keys_and_gates:
            gate.opened.set()
    assert took < PROMPT_S, f"close took {took:.1f} s"


WHERE_PY = '''
import threading

import torch
from torch import nn


class Where(nn.Module):
    """Remembers the thread each forward ran on and its intra-op thread count."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.seen = []

    def forward(self, x):
        self.seen.append((threading.current_thread().name, torch.get_num_threads()))
        return self.fc(x)
'''


def test_a_models_jobs_run_within_the_fleets_thread_budget_and_its_readiness_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A job alone takes the fleet's wide thread with every core of the budget (a budget of its own would
    give it one thread on its worker)."""
    (tmp_path / "where.py").write_text(WHERE_PY)
    # its forward records where it ran: predictions must run it in torch, not on ONNX Runtime
    spec = {
        "name": "where",
        "source": "python",
        "architecture": "where.py:Where",
        "input_size": [4],
        "onnxruntime": False,
    }

    async def scenario() -> list[tuple[str, int]]:
        fleet = Fleet(Settings(model_dir=tmp_path, worker_threads=1, cpu_threads=2, torch_threads=2))
        try:
            entry = fleet.add(ModelSpec.model_validate(spec))
            await wait_until_async(lambda: entry.status is not Status.loading, "the model loaded")
            assert entry.status is Status.ready, entry.error
            assert entry.model is not None
            assert entry.executor is not None
            seen = cast(list[tuple[str, int]], entry.model.module.seen)  # the Where module's own list
            seen.clear()  # the load's own probe
            await entry.executor.predict(torch.zeros(1, 4))
            return seen
        finally:
            await asyncio.wait_for(fleet.close(), PROMPT_S)

    with caplog.at_level(logging.INFO, logger="hookserve.registry"):
        assert asyncio.run(scenario()) == [("hookserve-wide", 2)]
    ready = [r.getMessage() for r in caplog.records if r.name == "hookserve.registry" and "ready" in r.getMessage()]
    assert len(ready) == 1
    assert ready[0].startswith("model where ready on cpu in ")


def test_closing_the_fleet_releases_each_devices_memory_once_not_once_per_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """close() skips each model's own release (a full gc.collect each) and releases every device once at the end."""
    (tmp_path / "where.py").write_text(WHERE_PY)
    released: list[torch.device] = []
    monkeypatch.setattr("service.runtime.fleet.release_device_memory", released.append)

    async def scenario() -> None:
        fleet = Fleet(Settings(model_dir=tmp_path, worker_threads=1))
        entries = [
            fleet.add(
                ModelSpec.model_validate(
                    {"name": n, "source": "python", "architecture": "where.py:Where", "input_size": [4]}
                )
            )
            for n in ("one", "two")
        ]
        await wait_until_async(lambda: all(e.status is not Status.loading for e in entries), "the models loaded")
        assert all(e.status is Status.ready for e in entries), [e.error for e in entries]
        await asyncio.wait_for(fleet.close(), PROMPT_S)

    asyncio.run(scenario())
    assert released == [torch.device("cpu")]


def test_a_models_own_batch_delay_overrides_the_servers(tmp_path: Path) -> None:
    """`max_batch_delay_ms` in a model's spec is that model's; a model without one takes the server's setting."""
    (tmp_path / "where.py").write_text(WHERE_PY)
    base = {"source": "python", "architecture": "where.py:Where", "input_size": [4]}

    async def scenario() -> dict[str, float]:
        fleet = Fleet(Settings(model_dir=tmp_path, worker_threads=1, max_batch_delay_ms=7.0))
        try:
            own = fleet.add(ModelSpec.model_validate(base | {"name": "own", "max_batch_delay_ms": 0.0}))
            server = fleet.add(ModelSpec.model_validate(base | {"name": "server"}))
            await wait_until_async(lambda: own.status is not Status.loading, "own loaded")
            await wait_until_async(lambda: server.status is not Status.loading, "server loaded")
            delays = {}
            for entry in (own, server):
                assert entry.executor is not None, entry.error
                delays[entry.spec.name] = entry.executor.config.max_batch_delay_ms
            return delays
        finally:
            await asyncio.wait_for(fleet.close(), PROMPT_S)

    assert asyncio.run(scenario()) == {"own": 0.0, "server": 7.0}
