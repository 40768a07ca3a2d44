"""`python -m service`: flags and HOOKSERVE_* environment, flags winning; uvicorn gets one worker."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI

import service.__main__ as cli
from service.config import Settings
from service.main import create_app

ENV_NAMES = ("CONFIG", "MODEL_DIR", "HOST", "PORT", "DEVICE", "ADMIN_TOKEN", "MAX_INPUTS", "ALLOW_DOWNLOADS")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV_NAMES:
        monkeypatch.delenv(f"HOOKSERVE_{name}", raising=False)


@pytest.fixture(autouse=True)
def restore_process_state() -> Iterator[None]:
    """`main()` configures logging and signal handlers for a real server: undo that for the other tests."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    sigterm = signal.getsignal(signal.SIGTERM)
    yield
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)
    signal.signal(signal.SIGTERM, sigterm)


def test_help_runs_as_a_module() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "service", "--help"], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    for flag in ("--config", "--model-dir", "--host", "--port", "--device"):
        assert flag in result.stdout
    assert "HOOKSERVE_CONFIG" in result.stdout


def test_parse_args_keeps_only_given_flags(tmp_path: Path) -> None:
    assert cli.parse_args([]) == {}
    parsed = cli.parse_args(
        [
            "--config",
            str(tmp_path / "m.toml"),
            "--model-dir",
            str(tmp_path),
            "--host",
            "0.0.0.0",
            "--port",
            "9001",
            "--device",
            "cpu",
        ]
    )
    assert parsed == {
        "config": tmp_path / "m.toml",
        "model_dir": tmp_path,
        "host": "0.0.0.0",
        "port": 9001,
        "device": "cpu",
    }


def test_bad_port_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.parse_args(["--port", "eighty"])
    assert info.value.code == 2
    assert "--port" in capsys.readouterr().err


def test_settings_read_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOOKSERVE_CONFIG", str(tmp_path / "m.toml"))
    monkeypatch.setenv("HOOKSERVE_MODEL_DIR", str(tmp_path))
    monkeypatch.setenv("HOOKSERVE_HOST", "0.0.0.0")
    monkeypatch.setenv("HOOKSERVE_PORT", "9000")
    monkeypatch.setenv("HOOKSERVE_DEVICE", "cpu")
    monkeypatch.setenv("HOOKSERVE_ADMIN_TOKEN", "s3cret")
    monkeypatch.setenv("HOOKSERVE_MAX_INPUTS", "7")
    monkeypatch.setenv("HOOKSERVE_ALLOW_DOWNLOADS", "true")
    settings = Settings()
    assert settings.config == tmp_path / "m.toml"
    assert settings.model_dir == tmp_path
    assert (settings.host, settings.port, settings.device) == ("0.0.0.0", 9000, "cpu")
    assert settings.admin_token == "s3cret"
    assert settings.max_inputs == 7
    assert settings.allow_downloads is True


def test_defaults_match_api_md() -> None:
    settings = Settings()
    mib = 1024 * 1024
    assert (settings.host, settings.port, settings.device) == ("127.0.0.1", 8000, "auto")
    assert settings.config is None
    assert settings.admin_token is None
    assert settings.allow_downloads is False
    assert settings.max_body_bytes == 64 * mib
    assert settings.max_inputs == 64
    assert settings.max_image_pixels == 40_000_000
    assert settings.max_json_response_bytes == 64 * mib
    assert settings.max_binary_response_bytes == 1024 * mib
    assert settings.max_queue == 256
    assert settings.max_ig_steps == 512
    assert settings.max_smoothgrad_samples == 256
    assert settings.max_upload_bytes == 2048 * mib


def test_flags_win_over_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOOKSERVE_PORT", "9000")
    monkeypatch.setenv("HOOKSERVE_HOST", "0.0.0.0")
    monkeypatch.setenv("HOOKSERVE_MODEL_DIR", str(tmp_path / "from-env"))
    calls: list[uvicorn.Config] = []
    monkeypatch.setattr(cli, "serve", lambda app, settings: calls.append(cli.uvicorn_config(app, settings)))
    cli.main(["--port", "9001", "--model-dir", str(tmp_path)])
    (config,) = calls
    assert config.port == 9001  # the flag
    assert config.host == "0.0.0.0"  # no flag: the environment
    assert config.workers == 1
    assert isinstance(config.app, FastAPI)
    assert config.app.title == "hookserve"


def test_main_builds_the_app_from_merged_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOOKSERVE_DEVICE", "cuda")
    seen: list[Settings] = []

    def spy(settings: Settings) -> Any:
        seen.append(settings)
        return create_app(settings)

    monkeypatch.setattr("service.__main__.create_app", spy)
    monkeypatch.setattr(cli, "serve", lambda app, settings: None)
    cli.main(["--device", "cpu", "--model-dir", str(tmp_path)])
    (settings,) = seen
    assert settings.device == "cpu"
    assert settings.model_dir == tmp_path
    assert settings.port == 8000
