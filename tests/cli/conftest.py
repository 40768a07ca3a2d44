"""A live server for the command-line tests, and `hookserve` run in-process (`hookserve`) or as its own process
(`shell`, what a person at a terminal gets) with its output captured."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from service.cli.main import run
from tests.client.servers import serve_lenet
from tests.reliability.live_server import REPO_ROOT, LiveServer


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


def run_process(*argv: object, cwd: Path | None = None, env: dict[str, str] | None = None) -> Outcome:
    """`hookserve ARGV...` as a subprocess (`python -m service.cli`), stdin closed, stderr not a terminal."""
    done = subprocess.run(
        [sys.executable, "-m", "service.cli", *(str(a) for a in argv)],
        cwd=cwd or REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return Outcome(done.returncode, done.stdout, done.stderr)


@pytest.fixture
def shell(live: LiveServer) -> Hookserve:
    """`shell("predict", "lenet", path)`: hookserve as its own process, against the live server (HOOKSERVE_URL)."""

    def call(*argv: object, cwd: Path | None = None) -> Outcome:
        return run_process(*argv, cwd=cwd, env={"HOOKSERVE_URL": live.base_url})

    return call
