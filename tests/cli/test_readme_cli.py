"""Every `hookserve` line of the README runs against a live server and succeeds; the Python client example
prints what the README says it prints."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from service.cli.main import command_names
from tests.client.servers import TOKEN
from tests.conftest import write_lenet
from tests.reliability.live_server import REPO_ROOT, LiveServer, free_port

README = REPO_ROOT / "README.md"
MORE = """[[models]]
name = "lenet2"
source = "python"
architecture = "service.zoo.lenet:LeNet"
input_size = [3, 32, 32]
"""


def readme_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), flags=re.DOTALL)


def console_examples() -> list[tuple[str, str]]:
    """(command, what it prints) for every `$ hookserve ...` of the README's console blocks."""
    found = []
    for block in readme_blocks("console"):
        for chunk in re.split(r"^\$ ", block, flags=re.MULTILINE)[1:]:
            command, _, output = chunk.partition("\n")
            found.append((command, output.rstrip("\n")))
    return found


def hookserve_lines() -> list[str]:
    lines = [line.strip() for block in readme_blocks("bash") for line in block.splitlines()]
    shown = [line for line in lines if line.startswith("hookserve ") and not line.startswith("hookserve serve")]
    return shown + [command for command, _ in console_examples()]


def without_numbers(text: str) -> list[str]:
    """The words of `text`, each number as `#`: what the README shows, whatever the timings and the last digits."""
    return re.sub(r"-?\d+(\.\d+)?(e[-+]?\d+)?", "#", text).split()


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """Where the lines run: `service/` as in a checkout, a models dir with a valid config for `check`, and a TOML
    of one more model for `load`."""
    (tmp_path / "service").symlink_to(REPO_ROOT / "service")
    (tmp_path / "models").mkdir()
    (tmp_path / "models.toml").write_text(write_lenet(tmp_path / "models"))
    (tmp_path / "more.toml").write_text(MORE)
    return tmp_path


def test_the_readme_shows_every_command() -> None:
    shown = {line.split()[1] for line in hookserve_lines()}
    assert shown == set(command_names()) - {"serve"}


@pytest.mark.parametrize(("line", "printed"), console_examples())
def test_readme_command_prints_what_the_readme_shows(live: LiveServer, workdir: Path, line: str, printed: str) -> None:
    command = line.replace("hookserve ", f"{sys.executable} -m service.cli ", 1)
    env = {
        **os.environ,
        "HOOKSERVE_URL": live.base_url,
        "HOOKSERVE_ADMIN_TOKEN": TOKEN,
        "HOOKSERVE_PORT": str(free_port()),  # what `check` binds
        "PYTHONPATH": str(REPO_ROOT),
    }
    done = subprocess.run(
        ["bash", "-c", command], cwd=workdir, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    answer = done.stdout + (done.stderr if done.returncode else "")
    assert done.returncode in (0, 3), (command, done.stderr[-2000:])
    assert without_numbers(answer) == without_numbers(printed), (command, answer)


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
