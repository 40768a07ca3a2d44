"""`hookserve serve` is today's server: the same flags and environment as `python -m service`."""

from __future__ import annotations

from typing import Any

import pytest
import uvicorn

import service.__main__ as server_main
from service.cli.main import run


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    calls: list[list[str]] = []
    monkeypatch.setattr(server_main, "main", lambda argv, prog="": calls.append(list(argv)))
    return calls


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["serve", "--port", "9001", "--device", "cpu"], ["--port", "9001", "--device", "cpu"]),
        (["serve"], []),
        (["--config", "m.toml", "--model-dir", "models"], ["--config", "m.toml", "--model-dir", "models"]),
    ],
)
def test_serve_passes_its_flags_to_python_m_service(
    served: list[list[str]], argv: list[str], expected: list[str]
) -> None:
    assert run(argv) == 0
    assert served == [expected]


def test_serve_reaches_uvicorn_with_the_merged_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """Not stubbed: the real `python -m service` main, up to the server's start."""
    monkeypatch.setenv("HOOKSERVE_HOST", "127.0.0.2")
    monkeypatch.delenv("HOOKSERVE_CONFIG", raising=False)
    seen: list[uvicorn.Config] = []
    monkeypatch.setattr(
        server_main, "serve", lambda app, settings: seen.append(server_main.uvicorn_config(app, settings))
    )
    monkeypatch.setattr("service.__main__.configure_logging", lambda level: None)
    monkeypatch.setattr("service.__main__.signal.signal", lambda *args: None)
    assert run(["serve", "--port", "9002", "--model-dir", str(tmp_path), "--device", "cpu"]) == 0
    (config,) = seen
    assert (config.host, config.port, config.workers) == ("127.0.0.2", 9002, 1)


def test_help_is_not_serving(served: list[list[str]], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        run(["--help"])
    assert info.value.code == 0
    assert served == []
    assert "COMMAND" in capsys.readouterr().out
