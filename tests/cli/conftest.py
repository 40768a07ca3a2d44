"""A live server for the command-line tests, and `hookserve` run in-process with its output captured."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from service.cli.main import run
from tests.client.servers import serve_lenet
from tests.reliability.live_server import LiveServer


@dataclass(frozen=True)
class Outcome:
    status: int
    out: str
    err: str


Hookserve = Callable[..., Outcome]


@pytest.fixture(scope="session")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with serve_lenet(tmp_path_factory.mktemp("cli-models")) as server:
        yield server


@pytest.fixture
def hookserve(capsys: pytest.CaptureFixture[str]) -> Hookserve:
    """`hookserve("predict", "lenet", path)`: the exit status and what it printed."""

    def call(*argv: object) -> Outcome:
        capsys.readouterr()
        status = run([str(a) for a in argv])
        captured = capsys.readouterr()
        return Outcome(status, captured.out, captured.err)

    return call
