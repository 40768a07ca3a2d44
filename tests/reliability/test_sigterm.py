"""SIGTERM on a live `python -m service`: stop accepting, finish in-flight jobs within the grace period, exit 0."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

import service.__main__ as entry
from tests.reliability.live_server import LiveServer, slow_input, write_slow


def _post_in_background(url: str, body: dict[str, Any]) -> tuple[threading.Thread, dict[str, Any]]:
    result: dict[str, Any] = {}

    def call() -> None:
        try:
            result["response"] = httpx.post(url, json=body, timeout=60)
        except httpx.TransportError as exc:
            result["error"] = exc

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    return thread, result


def _wait_running(server: LiveServer) -> None:
    """Until the slow job holds its hooks, i.e. it is running on the worker."""
    deadline = time.monotonic() + 10
    while httpx.get(f"{server.base_url}/models/slow", timeout=5).json()["hooks"] == 0:
        assert time.monotonic() < deadline, "the slow request never started"
        time.sleep(0.02)


def _refuses_connections(server: LiveServer, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            httpx.get(f"{server.base_url}/healthz", timeout=1)
        except (httpx.ConnectError, httpx.RemoteProtocolError):  # refused, or closed unanswered while closing
            return True
        time.sleep(0.05)
    return False


def test_sigterm_finishes_in_flight_request_then_exits_0(tmp_path: Path) -> None:
    grace = 10.0
    body = {"model": "slow", "inputs": [slow_input(2.0, fill=0.5)], "layers": ["body"]}
    with LiveServer(tmp_path, write_slow(tmp_path), env={"HOOKSERVE_SHUTDOWN_GRACE_S": str(grace)}) as server:
        thread, result = _post_in_background(f"{server.base_url}/activations", body)
        _wait_running(server)
        signalled = time.monotonic()
        server.signal(signal.SIGTERM)
        assert _refuses_connections(server, within=1.5), "still accepting connections after SIGTERM"
        assert thread.is_alive(), "the in-flight request should still be running while new ones are refused"
        code = server.wait(timeout=grace + 10)
        elapsed = time.monotonic() - signalled
        thread.join(5)
        assert code == 0, server.log()
        assert elapsed < grace, f"took {elapsed:.1f} s, over shutdown_grace_s"
    response = result["response"]
    assert response.status_code == 200
    answer = response.json()
    assert answer["activations"]["body"]["output"]["shape"] == [1, 3]


def test_sigterm_cuts_jobs_past_the_grace_period(tmp_path: Path) -> None:
    """A job longer than shutdown_grace_s does not hold the process: it still exits 0, soon after the grace."""
    grace = 1.0
    body = {"model": "slow", "inputs": [slow_input(8.0)], "layers": ["body"]}
    with LiveServer(tmp_path, write_slow(tmp_path), env={"HOOKSERVE_SHUTDOWN_GRACE_S": str(grace)}) as server:
        thread, result = _post_in_background(f"{server.base_url}/activations", body)
        _wait_running(server)
        signalled = time.monotonic()
        server.signal(signal.SIGTERM)
        code = server.wait(timeout=20)
        elapsed = time.monotonic() - signalled
        thread.join(5)
        assert code == 0, server.log()
        assert elapsed < 3 * grace + 2, f"took {elapsed:.1f} s for a {grace} s grace period"
    assert "response" not in result or result["response"].status_code != 200


def test_entry_point_passes_the_grace_period_and_exits_0_on_sigterm(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`python -m service` hands shutdown_grace_s (rounded up) to uvicorn and maps uvicorn's re-raised SIGTERM to 0."""
    seen: dict[str, Any] = {}

    def fake_run(app: object, **kwargs: Any) -> None:
        seen.update(kwargs, handler=signal.getsignal(signal.SIGTERM))

    previous = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr("service.__main__.uvicorn.run", fake_run)
    monkeypatch.setattr(entry, "configure_logging", lambda level: None)
    monkeypatch.setenv("HOOKSERVE_SHUTDOWN_GRACE_S", "2.5")
    (tmp_path / "models.toml").write_text("")  # no models; start-up refuses a config file that is not there
    monkeypatch.setenv("HOOKSERVE_CONFIG", str(tmp_path / "models.toml"))
    try:
        entry.main([])
        handler = seen["handler"]
        assert seen["timeout_graceful_shutdown"] == 3
        assert callable(handler)
        with pytest.raises(SystemExit) as exited:
            handler(signal.SIGTERM, None)
        assert exited.value.code == 0
    finally:
        signal.signal(signal.SIGTERM, previous)
