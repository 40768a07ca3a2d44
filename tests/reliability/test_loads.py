"""Loads isolated from each other: a model whose `__init__` hangs delays no other load, times out after
`load_timeout_s`, can be deleted at once (and its name reused), and holds up no shutdown.

The hanging model waits for a gate file (`tests.helpers.hanging`); every gate is opened when a test
ends, so no load thread outlives the test by long. Bounds on "at once" are generous (seconds) against
loads that would otherwise hang for minutes.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import torch
from fastapi.testclient import TestClient

from service.config import Settings
from service.main import create_app
from tests.conftest import ClientFactory, tensor_input
from tests.helpers.config import toy_entry
from tests.helpers.hanging import Gates, hanging_entry, hanging_spec, write_hanging
from tests.helpers.metrics import scrape, value
from tests.helpers.models import WIDTH
from tests.helpers.waiting import wait_until
from tests.reliability.live_server import LiveServer

ADMIN = "loads-admin-token"
AUTH = {"Authorization": f"Bearer {ADMIN}"}
PROMPT_S = 5.0  # "at once", on a busy two-core machine; the hanging loads would take minutes
ONES = tensor_input(torch.ones(WIDTH))
TINY = {"name": "tiny", "source": "python", "architecture": "tests.helpers.models:Echo", "input_size": [WIDTH]}


def status(client: TestClient, name: str) -> str:
    answer: str = client.get(f"/models/{name}").json()["status"]
    return answer


def abandoned(client: TestClient) -> float:
    return value(scrape(client), "hookserve_abandoned_loads")


def scale_of(client: TestClient, name: str) -> float:
    """The value of the `Hanging` model's one parameter, read back from the served model."""
    entries = client.get(f"/models/{name}/state-dict", params={"stats": "true"}).json()["entries"]
    (scale,) = (e for e in entries if e["key"] == "scale")
    mean: float = scale["mean"]
    return mean


def hanging_client(make_client: ClientFactory, model_dir: Path, gate: str, **settings: Any) -> TestClient:
    write_hanging(model_dir)
    client = make_client(hanging_entry("hang", gate), wait=False, admin_token=ADMIN, worker_threads=1, **settings)
    assert status(client, "hang") == "loading"
    return client


def test_a_hanging_load_does_not_delay_a_later_one(make_client: ClientFactory, tmp_path: Path) -> None:
    with Gates(tmp_path) as gates:
        client = hanging_client(make_client, tmp_path, gates.closed("gate"))
        added = time.monotonic()
        assert client.post("/models", json=TINY, headers=AUTH).status_code == 202
        wait_until(lambda: status(client, "tiny") != "loading", "tiny loaded beside the hanging model", 30)
        waited = time.monotonic() - added
        assert status(client, "tiny") == "ready", client.get("/models/tiny").json()
        assert status(client, "hang") == "loading"
        r = client.post("/predict", json={"model": "tiny", "inputs": [ONES]})
        assert r.status_code == 200, r.text
        assert waited < 30


def test_a_load_past_load_timeout_s_fails_naming_the_setting(make_client: ClientFactory, tmp_path: Path) -> None:
    with Gates(tmp_path) as gates:
        client = hanging_client(make_client, tmp_path, gates.closed("gate"), load_timeout_s=0.5)
        wait_until(lambda: status(client, "hang") != "loading", "the hanging load timed out", 30)
        info = client.get("/models/hang").json()
        assert info["status"] == "failed"
        assert "load_timeout_s = 0.5 s" in info["error"]
        assert "HOOKSERVE_LOAD_TIMEOUT_S" in info["error"]
        assert client.get("/readyz").json()["models"]["hang"] == {"status": "failed", "error": info["error"]}
        r = client.post("/predict", json={"model": "hang", "inputs": [ONES]})
        assert r.status_code == 409
        assert "load_timeout_s" in r.json()["detail"]
        assert abandoned(client) == 1  # its thread still waits for the gate
        (tmp_path / "gate").touch()
        wait_until(lambda: abandoned(client) == 0, "the abandoned load finished")
        assert status(client, "hang") == "failed"  # what it built was discarded, not installed


def test_deleting_a_loading_model_answers_at_once_and_its_name_loads_again(
    make_client: ClientFactory, tmp_path: Path
) -> None:
    with ThreadPoolExecutor(1) as pool, Gates(tmp_path) as gates:  # gates open before the pool joins
        client = hanging_client(make_client, tmp_path, gates.closed("old-gate"))
        started = time.monotonic()
        r = pool.submit(client.delete, "/models/hang", headers=AUTH).result(timeout=PROMPT_S)
        assert time.monotonic() - started < PROMPT_S
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "loading"  # its INFO as it was
        assert client.get("/models/hang").status_code == 404
        assert abandoned(client) == 1

        again = hanging_spec("hang", gates.open("new-gate"), scale=3.0)
        assert client.post("/models", json=again, headers=AUTH).status_code == 202
        wait_until(lambda: status(client, "hang") != "loading", "the new hang loaded")
        assert status(client, "hang") == "ready"
        assert scale_of(client, "hang") == 3.0

        (tmp_path / "old-gate").touch()  # the old load (scale 1) finishes now, and must not replace the new one
        wait_until(lambda: abandoned(client) == 0, "the abandoned load finished")
        assert status(client, "hang") == "ready"
        assert scale_of(client, "hang") == 3.0


def test_shutdown_does_not_wait_for_a_hanging_load(tmp_path: Path) -> None:
    with ThreadPoolExecutor(1) as pool, Gates(tmp_path) as gates:  # gates open before the pool joins
        write_hanging(tmp_path)
        (tmp_path / "models.toml").write_text(hanging_entry("hang", gates.closed("gate")))
        client = TestClient(create_app(Settings(model_dir=tmp_path, config=tmp_path / "models.toml")))
        client.__enter__()
        assert status(client, "hang") == "loading"
        started = time.monotonic()
        pool.submit(client.__exit__, None, None, None).result(timeout=PROMPT_S)
        assert time.monotonic() - started < PROMPT_S


def test_a_live_server_survives_a_model_that_exits_and_stops_beside_a_hanging_load(tmp_path: Path) -> None:
    """In a real process: SystemExit in a model's __init__ fails that model only, and SIGTERM while a load
    hangs exits promptly: shutdown does not wait for the load, and the exit only `shutdown_grace_s`."""
    write_hanging(tmp_path)
    exits = {"name": "exits", "source": "python", "architecture": "hanging.py:Exits", "input_size": [WIDTH]}
    env = {"HOOKSERVE_ADMIN_TOKEN": ADMIN, "HOOKSERVE_SHUTDOWN_GRACE_S": "2"}  # exit waits 2 s for the hung load
    with Gates(tmp_path) as gates, LiveServer(tmp_path, toy_entry("tiny", "Echo"), env=env) as live:
        url = live.base_url
        assert httpx.post(f"{url}/models", json=exits, headers=AUTH, timeout=10).status_code == 202
        assert httpx.post(f"{url}/models", json=hanging_spec("hang", gates.closed("gate")), headers=AUTH).is_success

        def info(name: str) -> dict[str, Any]:
            answer: dict[str, Any] = httpx.get(f"{url}/models/{name}", timeout=10).json()
            return answer

        wait_until(lambda: info("exits")["status"] != "loading", "the exiting model settled")
        assert info("exits")["status"] == "failed"
        assert "SystemExit" in info("exits")["error"]
        assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200
        assert info("hang")["status"] == "loading"
        started = time.monotonic()
        assert live.stop(timeout=30) == 0, live.log()
        assert time.monotonic() - started < 15, live.log()
