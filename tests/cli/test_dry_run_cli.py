"""`--dry-run` on the commands that run a model: the estimate as a table or JSON, equal to the client's."""

from __future__ import annotations

import json

import pytest

from service.client import Client
from service.zoo.lenet import samples_dir
from tests.cli.conftest import Hookserve
from tests.reliability.live_server import LiveServer

DIGIT_7 = samples_dir() / "digit_7.png"


@pytest.fixture
def url(live: LiveServer, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("HOOKSERVE_URL", live.base_url)
    return live.base_url


def test_saliency_dry_run_prints_the_estimate(hookserve: Hookserve, url: str) -> None:
    args = ("saliency", "lenet", DIGIT_7, "-m", "occlusion", "-p", "window=[4,4]", "--dry-run")
    answer = hookserve(*args, "--json")
    assert answer.status == 0, answer.err
    with Client(url) as client:
        expected = client.estimate("/saliency", "lenet", DIGIT_7, method="occlusion", window=[4, 4])
    assert json.loads(answer.out)["forwards"] == expected.forwards
    table = hookserve(*args)
    assert table.status == 0, table.err
    assert table.out.splitlines()[0].split() == ["estimate", "value"]
    assert f"forwards {expected.forwards}" in " ".join(table.out.split())


@pytest.mark.parametrize("command", [("predict",), ("activations", "-l", "conv1")])
def test_other_commands_take_dry_run(hookserve: Hookserve, url: str, command: tuple[str, ...]) -> None:
    answer = hookserve(command[0], "lenet", DIGIT_7, *command[1:], "--dry-run", "--json")
    assert answer.status == 0, answer.err
    found = json.loads(answer.out)
    assert found["forwards"] == 1
    assert found["admitted"] is True
