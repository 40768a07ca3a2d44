"""The fleet over `Loads`: a load past `load_timeout_s` fails naming the setting; removing a loading model and
closing the fleet never wait for a hung load."""

from __future__ import annotations

import asyncio
from pathlib import Path

from service.config import Settings
from service.runtime.fleet import Fleet, Status
from service.specs.model import ModelSpec
from tests.helpers.hanging import Gates, hanging_spec, write_hanging
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
