"""Faults survived: device OOM inside a job, models that fail to build or load, clients that leave mid-request."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

import service.runtime.executor as executor_module
from tests.conftest import ClientFactory, b64, sample_png, write_lenet
from tests.reliability.live_server import LiveServer, slow_input, write_slow

ADMIN = "s3cret-admin-token"
OOM = slow_input(-7.0)


def wait_until(condition: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        time.sleep(0.02)


# ---- device out of memory ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "extra"),
    [
        ("/predict", {}),
        ("/activations", {"layers": ["body"]}),
        ("/gradients", {"layers": ["body"]}),
        ("/saliency", {"method": "integrated_gradients", "steps": 4}),
    ],
)
def test_device_oom_is_503_and_the_model_keeps_serving(
    make_client: ClientFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str, extra: dict[str, Any]
) -> None:
    released: list[torch.device] = []
    real_release = executor_module.release_device_memory

    def spy(device: torch.device) -> None:
        released.append(device)
        real_release(device)

    monkeypatch.setattr(executor_module, "release_device_memory", spy)
    client = make_client(write_slow(tmp_path), worker_threads=1)
    r = client.post(path, json={"model": "slow", "inputs": [OOM]} | extra)
    assert r.status_code == 503
    assert "out of memory" in r.json()["detail"]
    assert int(r.headers["Retry-After"]) >= 1
    assert released == [torch.device("cpu")]  # caches released once, for this job
    info = client.get("/models/slow").json()
    assert info["status"] == "ready"
    assert info["hooks"] == 0
    assert client.post(path, json={"model": "slow", "inputs": [slow_input(fill=0.25)]} | extra).status_code == 200


def test_device_oom_in_a_batch_fails_only_that_batch(make_client: ClientFactory, tmp_path: Path) -> None:
    client = make_client(write_slow(tmp_path), worker_threads=1)
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(client.post, "/predict", json={"model": "slow", "inputs": [OOM]}) for _ in range(4)]
        assert {f.result().status_code for f in futures} == {503}
    r = client.post("/predict", json={"model": "slow", "inputs": [slow_input(fill=1.0)] * 3})
    assert r.status_code == 200
    assert len(r.json()["predictions"]) == 3


# ---- models that fail to build or load ---------------------------------------------------

BROKEN_FILES = {
    "crashes.py": (
        "from torch import nn\n\n"
        "class Crashes(nn.Module):\n"
        "    def __init__(self) -> None:\n"
        "        raise RuntimeError(f'bad layer config in {__file__}')\n"
    ),
    "syntax.py": "class Broken(:\n",
}
FIXED_CRASHES = (
    "from torch import nn\n\n"
    "class Crashes(nn.Module):\n"
    "    def __init__(self) -> None:\n"
    "        super().__init__()\n"
    "        self.fc = nn.Linear(16, 2)\n\n"
    "    def forward(self, x):\n"
    "        return self.fc(x.flatten(1))\n"
)


class Evil:
    """Unpickling this would create a directory: proof that no pickle code ever runs."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (str(self.marker),))


def broken_config(model_dir: Path) -> str:
    for name, text in BROKEN_FILES.items():
        (model_dir / name).write_text(text)
    torch.save({"not_a_layer.weight": torch.zeros(2)}, model_dir / "mismatch.pt")
    torch.save({"body.weight": Evil(model_dir / "pwned")}, model_dir / "evil.pt")
    slow = write_slow(model_dir)
    entries = {
        "crashes": 'source = "python"\narchitecture = "crashes.py:Crashes"\ninput_size = [1, 4, 4]',
        "syntax": 'source = "python"\narchitecture = "syntax.py:Broken"',
        "noclass": 'source = "python"\narchitecture = "slow.py:Missing"',
        "noweights": 'source = "python"\narchitecture = "slow.py:Slow"\nweights = "missing.pt"',
        "mismatch": 'source = "python"\narchitecture = "slow.py:Slow"\nweights = "mismatch.pt"',
        "evil": 'source = "python"\narchitecture = "slow.py:Slow"\nweights = "evil.pt"',
        "nolib": 'source = "torchvision"\narchitecture = "resnet1800"',
    }
    broken = "".join(f'\n[[models]]\nname = "{name}"\n{body}\n' for name, body in entries.items())
    return write_lenet(model_dir) + slow + broken


EXPECTED_ERRORS = {
    "crashes": r"RuntimeError: bad layer config in <model dir>/crashes\.py",
    "syntax": r"SyntaxError",
    "noclass": r"not an nn\.Module class",
    "noweights": r"no file 'missing\.pt'",
    "mismatch": r"mismatch\.pt does not match the architecture",
    "evil": r"evil\.pt could not be read as a weights-only checkpoint",
    "nolib": r"torchvision has no model 'resnet1800'; closest: \[.*'resnet18'",
}


def test_failed_models_report_their_error_while_others_serve(make_client: ClientFactory, tmp_path: Path) -> None:
    client = make_client(broken_config(tmp_path), admin_token=ADMIN, worker_threads=1)
    infos = {m["name"]: m for m in client.get("/models").json()["models"]}
    assert infos["lenet"]["status"] == "ready"
    assert infos["slow"]["status"] == "ready"
    ready = client.get("/readyz")
    assert ready.status_code == 503
    not_ready = ready.json()["models"]
    assert set(not_ready) == set(EXPECTED_ERRORS)
    for name, pattern in EXPECTED_ERRORS.items():
        assert infos[name]["status"] == "failed"
        assert re.search(pattern, infos[name]["error"]), infos[name]["error"]
        assert not_ready[name] == {"status": "failed", "error": infos[name]["error"]}
        for leak in (str(tmp_path), "site-packages", "Traceback", "/usr/"):
            assert leak not in infos[name]["error"]
        r = client.post("/predict", json={"model": name, "inputs": [slow_input()]})
        assert r.status_code == 409
        assert "failed" in r.json()["detail"]
    assert not (tmp_path / "pwned").exists()
    r = client.post("/predict", json={"model": "lenet", "inputs": [{"image": b64(sample_png(4))}]})
    assert r.status_code == 200
    assert r.json()["predictions"][0]["top_k"][0]["label"] == "4"
    assert client.post("/predict", json={"model": "slow", "inputs": [slow_input()]}).status_code == 200


def test_post_models_retries_a_failed_model(make_client: ClientFactory, tmp_path: Path) -> None:
    client = make_client(broken_config(tmp_path), admin_token=ADMIN, worker_threads=1)
    assert client.get("/models/crashes").json()["status"] == "failed"
    (tmp_path / "crashes.py").write_text(FIXED_CRASHES)
    spec = {"name": "crashes", "source": "python", "architecture": "crashes.py:Crashes", "input_size": [1, 4, 4]}
    r = client.post("/models", json=spec, headers={"Authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 202
    assert r.json()["status"] == "loading"
    wait_until(lambda: client.get("/models/crashes").json()["status"] != "loading")
    info = client.get("/models/crashes").json()
    assert info["status"] == "ready"
    assert info["error"] is None
    assert info["num_classes"] == 2
    assert client.post("/predict", json={"model": "crashes", "inputs": [slow_input()]}).status_code == 200
    assert "crashes" not in client.get("/readyz").json()["models"]
    # A ready model is not replaced by a second POST.
    again = client.post("/models", json=spec, headers={"Authorization": f"Bearer {ADMIN}"})
    assert again.status_code == 409
    for name in EXPECTED_ERRORS.keys() - {"crashes"}:
        assert client.delete(f"/models/{name}", headers={"Authorization": f"Bearer {ADMIN}"}).status_code == 200
    assert client.get("/readyz").status_code == 200


# ---- clients that leave mid-request (live server) ----------------------------------------


def _queue_depth(server: LiveServer, model: str) -> float:
    text = httpx.get(f"{server.base_url}/metrics", timeout=5).text
    match = re.search(rf'^hookserve_queue_depth\{{model="{model}"\}} (\S+)$', text, re.MULTILINE)
    assert match, "hookserve_queue_depth not in /metrics"
    return float(match.group(1))


def _hooks(server: LiveServer) -> int:
    count: int = httpx.get(f"{server.base_url}/models/slow", timeout=5).json()["hooks"]
    return count


async def _abandon_requests(server: LiveServer) -> None:
    """One slow job running and two queued behind it, then every client goes away."""
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        running = asyncio.create_task(
            client.post("/activations", json={"model": "slow", "inputs": [slow_input(1.0)], "layers": ["body"]})
        )
        while (await client.get("/models/slow")).json()["hooks"] == 0:
            await asyncio.sleep(0.02)
        queued = [
            asyncio.create_task(client.post("/gradients", json={"model": "slow", "inputs": [slow_input(0.3)]}))
            for _ in range(2)
        ]
        await asyncio.sleep(0.2)
        for task in (running, *queued):
            task.cancel()
        await asyncio.gather(running, *queued, return_exceptions=True)


def _leave_mid_body(server: LiveServer, head: bytes) -> None:
    """Announce a 10000-byte body, send a little of it, hang up."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(head)
        time.sleep(0.1)


def test_client_disconnects_leak_no_hooks_and_no_queue_slots(tmp_path: Path) -> None:
    env = {"HOOKSERVE_MAX_QUEUE": "2", "HOOKSERVE_WORKER_THREADS": "1"}
    with LiveServer(tmp_path, write_slow(tmp_path), env=env) as server:
        asyncio.run(_abandon_requests(server))
        body = json.dumps({"model": "slow", "inputs": [slow_input()], "layers": ["body"]}).encode()
        _leave_mid_body(
            server,
            b"POST /activations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 10000\r\n\r\n" + body[:40],
        )
        _leave_mid_body(
            server,
            b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=XX\r\n"
            b'Content-Length: 10000\r\n\r\n--XX\r\nContent-Disposition: form-data; name="model"\r\n\r\nslow\r\n',
        )
        wait_until(lambda: _hooks(server) == 0 and _queue_depth(server, "slow") == 0)
        # The whole queue is usable again: one running + max_queue waiting all succeed.
        with ThreadPoolExecutor(3) as pool:
            first = pool.submit(
                httpx.post,
                f"{server.base_url}/activations",
                json={"model": "slow", "inputs": [slow_input(0.8)], "layers": ["body"]},
                timeout=30,
            )
            wait_until(lambda: _hooks(server) > 0)
            rest = [
                pool.submit(httpx.post, f"{server.base_url}/predict", json={"model": "slow", "inputs": [slow_input()]})
                for _ in range(2)
            ]
            assert first.result().status_code == 200
            assert [f.result().status_code for f in rest] == [200, 200]
        assert _hooks(server) == 0
        assert _queue_depth(server, "slow") == 0
        log = server.log()
    assert "Traceback" not in log, log
    assert '"level":"error"' not in log, log
