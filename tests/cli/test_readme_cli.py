"""Every `hookserve` line of the README runs against a live server and succeeds; the Python client example
prints what the README says it prints."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import write_lenet
from tests.reliability.live_server import REPO_ROOT, LiveServer

README = REPO_ROOT / "README.md"


def readme_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), flags=re.DOTALL)


def hookserve_lines() -> list[str]:
    lines = [line.strip() for block in readme_blocks("bash") for line in block.splitlines()]
    return [line for line in lines if line.startswith("hookserve ") and not line.startswith("hookserve serve")]


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """Where the lines run: `service/` as in a checkout, and a models dir with a valid config for `check`."""
    (tmp_path / "service").symlink_to(REPO_ROOT / "service")
    (tmp_path / "models").mkdir()
    (tmp_path / "models.toml").write_text(write_lenet(tmp_path / "models"))
    return tmp_path


def test_the_readme_shows_every_command() -> None:
    shown = {line.split()[1] for line in hookserve_lines()}
    assert shown >= {
        "check",
        "models",
        "predict",
        "activations",
        "saliency",
        "layers",
        "summary",
        "inspect",
        "features",
        "attention",
    }


@pytest.mark.parametrize("line", hookserve_lines())
def test_readme_command_succeeds(live: LiveServer, workdir: Path, line: str) -> None:
    command = line.replace("hookserve ", f"{sys.executable} -m service.cli ", 1)
    env = {**os.environ, "HOOKSERVE_URL": live.base_url, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        ["bash", "-c", command], cwd=workdir, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, (command, done.stdout[-2000:], done.stderr[-2000:])
    assert done.stdout.strip()


def client_examples() -> list[str]:
    return [block for block in readme_blocks("python") if "service.client" in block]


def test_the_readme_has_client_examples() -> None:
    assert len(client_examples()) >= 2  # the CNN one and the vision transformer one


@pytest.mark.parametrize("block", client_examples())
def test_the_client_example_prints_what_the_readme_says(live: LiveServer, block: str) -> None:
    code = block.replace("http://127.0.0.1:8000", live.base_url)
    expected = [line.removeprefix("# ") for line in code.splitlines() if line.startswith("# ")]
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == expected
