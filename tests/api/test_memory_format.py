"""`memory_format` per model: convolutional image models run NHWC unless configured otherwise."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from torchvision.models import ResNet

from tests.conftest import ClientFactory, tensor_input, wait_settled

MLP_PY = """
import torch
from torch import nn


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(12, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))
"""

VIEWER_PY = """
import torch
from torch import nn


class Viewer(nn.Module):
    \"\"\"Flattens with `.view`, which needs NCHW strides after the convolution.\"\"\"

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 6 * 6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return self.fc(y.view(y.shape[0], -1))
"""

CONFIG = """
[[models]]
name = "auto"
source = "torchvision"
architecture = "resnet18"
weights = "r18.pt"
fuse = false  # predictions on the module itself: its kernels in each format are what is compared

[[models]]
name = "plain"
source = "torchvision"
architecture = "resnet18"
weights = "r18.pt"
memory_format = "contiguous"
fuse = false

[[models]]
name = "mlp"
source = "python"
architecture = "mlp.py:Mlp"
input_size = [3, 2, 2]
"""


@pytest.fixture
def client(tmp_path: Path, make_client: ClientFactory, r18: ResNet) -> TestClient:
    torch.save(r18.state_dict(), tmp_path / "r18.pt")
    (tmp_path / "mlp.py").write_text(MLP_PY)
    return make_client(CONFIG, device="cpu")


def logits(client: TestClient, model: str, x: torch.Tensor) -> torch.Tensor:
    body: dict[str, Any] = {"model": model, "inputs": [tensor_input(x)], "include_logits": True}
    response = client.post("/predict", json=body)
    assert response.status_code == 200, response.text
    return torch.tensor(response.json()["predictions"][0]["logits"])


def test_auto_falls_back_to_contiguous_for_models_that_need_nchw(tmp_path: Path, make_client: ClientFactory) -> None:
    (tmp_path / "viewer.py").write_text(VIEWER_PY)
    entry = 'source = "python"\narchitecture = "viewer.py:Viewer"\ninput_size = [3, 6, 6]\n'
    config = (
        f'[[models]]\nname = "auto"\n{entry}\n[[models]]\nname = "forced"\n{entry}memory_format = "channels_last"\n'
    )
    client = make_client(config, device="cpu")
    auto = client.get("/models/auto").json()
    assert (auto["status"], auto["memory_format"]) == ("ready", "contiguous")
    torch.manual_seed(0)
    x = torch.randn(3, 6, 6)
    assert logits(client, "auto", x).shape == (2,)
    failed = client.get("/models/forced").json()
    assert failed["status"] == "failed"
    assert "view" in failed["error"]


def test_info_reports_the_memory_format_each_model_runs_in(client: TestClient) -> None:
    formats = {m["name"]: m["memory_format"] for m in client.get("/models").json()["models"]}
    assert formats == {"auto": "channels_last", "plain": "contiguous", "mlp": "contiguous"}


def test_builtin_convolutional_models_run_channels_last(builtin_client: TestClient) -> None:
    for name in ("lenet", "resnet18", "efficientvit_b0"):
        assert builtin_client.get(f"/models/{name}").json()["memory_format"] == "channels_last", name


def test_both_formats_answer_like_the_model_in_that_format(client: TestClient, r18: ResNet) -> None:
    x = torch.randn(3, 96, 96, generator=torch.Generator().manual_seed(4))
    nhwc = copy.deepcopy(r18).to(memory_format=torch.channels_last)
    with torch.inference_mode():
        want_plain = r18(x[None])[0]
        want_nhwc = nhwc(x[None].contiguous(memory_format=torch.channels_last))[0]
    got_plain, got_nhwc = logits(client, "plain", x), logits(client, "auto", x)
    torch.testing.assert_close(got_plain, want_plain, rtol=0, atol=1e-6)
    torch.testing.assert_close(got_nhwc, want_nhwc, rtol=0, atol=1e-6)
    torch.testing.assert_close(got_nhwc, got_plain, rtol=1e-4, atol=1e-4)  # same model, other kernels


def test_activations_come_back_in_the_usual_layout(client: TestClient, r18: ResNet) -> None:
    x = torch.randn(3, 64, 64, generator=torch.Generator().manual_seed(5))
    body = {"model": "auto", "inputs": [tensor_input(x)], "layers": ["layer1.0.conv1"], "format": "json"}
    response = client.post("/activations", json=body)
    assert response.status_code == 200, response.text
    got = response.json()["activations"]["layer1.0.conv1"]["output"]
    with torch.inference_mode():
        stem = r18.maxpool(r18.relu(r18.bn1(r18.conv1(x[None]))))
        want = r18.layer1[0].conv1(stem)
    assert got["shape"] == [1, 64, 16, 16]
    torch.testing.assert_close(torch.tensor(got["data"]), want, rtol=1e-4, atol=1e-4)


def test_memory_format_from_post_models_and_unknown_values_refused(make_client: ClientFactory) -> None:
    client = make_client(admin_token="t0ken", device="cpu")
    auth = {"Authorization": "Bearer t0ken"}
    spec = {"name": "odd", "source": "torchvision", "architecture": "resnet18", "memory_format": "nchw"}
    response = client.post("/models", json=spec, headers=auth)
    assert response.status_code == 422
    assert "memory_format" in response.text
    spec["memory_format"] = "contiguous"
    assert client.post("/models", json=spec, headers=auth).status_code in (200, 201, 202)
    wait_settled(client)
    assert client.get("/models/odd").json()["memory_format"] == "contiguous"
