"""/healthz and /readyz: live at once; ready only when every configured model is ready (API.md)."""

from __future__ import annotations

from pathlib import Path

import torch
from fastapi.testclient import TestClient

from tests.conftest import ClientFactory, tensor_input, wait_settled

# A model whose construction blocks until the test creates `release` beside it: loading is held open.
GATED_PY = """
import time
from pathlib import Path

import torch
from torch import nn


class Gated(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        gate = Path(__file__).with_name("release")
        deadline = time.monotonic() + 60
        while not gate.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        self.fc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))
"""
QUICK = """
[[models]]
name = "quick"
source = "python"
architecture = "gated.py:Gated"
input_size = [1, 2, 2]
"""
SLOW = """
[[models]]
name = "slow"
source = "python"
architecture = "gated.py:Gated"
input_size = [1, 2, 2]
"""
BROKEN = """
[[models]]
name = "broken"
source = "torchvision"
architecture = "no_such_net"
"""


def status_of(client: TestClient, name: str) -> str:
    status: str = client.get(f"/models/{name}").json()["status"]
    return status


def test_healthz_answers_while_serving(builtin_client: TestClient) -> None:
    response = builtin_client.get("/healthz")
    assert response.status_code == 200
    assert response.json()["status"] == "ok"


def test_readyz_is_200_when_all_models_are_ready(builtin_client: TestClient) -> None:
    response = builtin_client.get("/readyz")
    assert response.status_code == 200
    assert response.json() == {"status": "ready", "models": {}}


def test_readyz_and_predict_while_loading(tmp_path: Path, make_client: ClientFactory) -> None:
    (tmp_path / "gated.py").write_text(GATED_PY)
    client = make_client(SLOW + BROKEN, wait=False)
    try:
        healthz = client.get("/healthz")
        assert healthz.status_code == 200  # live even while nothing is ready
        assert status_of(client, "slow") == "loading"
        response = client.get("/readyz")
        assert response.status_code == 503
        assert response.json()["models"]["slow"] == {"status": "loading"}
        predict = client.post("/predict", json={"model": "slow", "inputs": [tensor_input(torch.zeros(1, 2, 2))]})
        assert predict.status_code == 409
        assert predict.json() == {"detail": "model 'slow' is loading"}
    finally:
        (tmp_path / "release").write_text("")
    wait_settled(client)
    assert status_of(client, "slow") == "ready"
    response = client.get("/readyz")
    assert response.status_code == 503  # a failed model is not ready either
    assert set(response.json()["models"]) == {"broken"}
    assert response.json()["models"]["broken"]["status"] == "failed"
    assert "no_such_net" in response.json()["models"]["broken"]["error"]
    ok = client.post("/predict", json={"model": "slow", "inputs": [tensor_input(torch.zeros(1, 2, 2))]})
    assert ok.status_code == 200


def test_readyz_is_200_once_every_configured_model_is_ready(tmp_path: Path, make_client: ClientFactory) -> None:
    (tmp_path / "gated.py").write_text(GATED_PY)
    (tmp_path / "release").write_text("")
    client = make_client(QUICK + SLOW.replace('"slow"', '"second"'))
    assert [m["status"] for m in client.get("/models").json()["models"]] == ["ready", "ready"]
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json() == {"status": "ready", "models": {}}
