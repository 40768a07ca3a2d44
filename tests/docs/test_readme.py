"""Every curl line and Python example of the README, run against a live server: none may fail."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.reliability.live_server import REPO_ROOT, LiveServer

README = REPO_ROOT / "README.md"
DOC_ADDRESS = "http://127.0.0.1:8000"
DOC_HOST = "127.0.0.1:8000"
TOKEN = "readme-token"
STATUS = re.compile(r"__STATUS__(\d{3})")
ENDPOINTS = (
    *("/predict", "/activations", "/gradients", "/saliency", "/models", "/layers", "/summary", "/state-dict"),
    *("/optimizer", "/checkpoints/inspect", "/healthz", "/readyz", "/metrics", "/v2/"),
)


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), flags=re.DOTALL)


def curl_lines() -> list[str]:
    lines = [line.strip() for block in _blocks("bash") for line in block.splitlines()]
    inline = re.findall(r"`(curl [^`]+)`", README.read_text())
    return [line for line in lines if line.startswith("curl ")] + inline


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with LiveServer(tmp_path_factory.mktemp("models"), None, env={"HOOKSERVE_ADMIN_TOKEN": TOKEN}) as live:
        yield live


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """Where the examples run: `service/` as in a checkout, output files land in a temp dir."""
    (tmp_path / "service").symlink_to(REPO_ROOT / "service")
    (tmp_path / ".curlrc").write_text('write-out = "%{stderr}__STATUS__%{http_code}\\n"\n')
    return tmp_path


def test_the_readme_has_examples_for_every_endpoint() -> None:
    text = " ".join(curl_lines())
    for path in ENDPOINTS:
        assert path in text, f"no curl example for {path}"


@pytest.mark.parametrize("line", curl_lines())
def test_curl_example_succeeds(server: LiveServer, workdir: Path, line: str) -> None:
    command = line.replace(DOC_ADDRESS, server.base_url)
    env = {**os.environ, "CURL_HOME": str(workdir), "HOOKSERVE_ADMIN_TOKEN": TOKEN}
    done = subprocess.run(
        ["bash", "-c", command], cwd=workdir, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    statuses = [int(code) for code in STATUS.findall(done.stderr)]
    assert done.returncode == 0, (command, done.stderr[-2000:], server.log())
    assert statuses, f"curl reported no status: {done.stderr[-500:]}"
    assert all(code < 400 for code in statuses), (statuses, done.stdout[-2000:])


@pytest.mark.parametrize("code", _blocks("python"))
def test_python_example_runs(server: LiveServer, code: str) -> None:
    script = code.replace(DOC_HOST, f"127.0.0.1:{server.port}")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
