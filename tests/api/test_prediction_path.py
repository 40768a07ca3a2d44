"""With ONNX Runtime off, predictions run on a fused copy (BatchNorm folded); hooks and /layers see the model as is."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient
from torchvision.models import ResNet

from tests.conftest import ClientFactory, tensor_input
from tests.helpers.reference_models import seeded_resnet18

CONFIG = """
[[models]]
name = "r18"
source = "torchvision"
architecture = "resnet18"
weights = "r18.pt"
onnxruntime = false

[[models]]
name = "r18_eager"
source = "torchvision"
architecture = "resnet18"
weights = "r18.pt"
fuse = false
onnxruntime = false

[[models]]
name = "looped"
source = "python"
architecture = "looped.py:Looped"
input_size = [3, 8, 8]
"""

LOOPED_PY = """
import torch
from torch import nn

class Looped(nn.Module):
    '''conv + bn, repeated as many times as the input's first value says: FX cannot trace it.'''

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)
        self.bn = nn.BatchNorm2d(3)
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        for _ in range(1 + int(x[0, 0, 0, 0] > 0)):
            x = self.bn(self.conv(x))
        return self.fc(x.mean((2, 3)))
"""


@pytest.fixture(scope="module")
def r18_trained_stats() -> ResNet:
    return resnet18_with_statistics()


def resnet18_with_statistics() -> ResNet:
    """A seeded resnet18 whose BatchNorm layers hold non-trivial statistics, so folding them changes numbers."""
    model = seeded_resnet18()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                for name, low, high in (("running_mean", -0.5, 0.5), ("running_var", 0.5, 2.0)):
                    getattr(module, name).uniform_(low, high, generator=generator)
                module.weight.uniform_(0.5, 1.5, generator=generator)
                module.bias.uniform_(-0.2, 0.2, generator=generator)
    return model.eval()


@pytest.fixture
def client(tmp_path: Path, make_client: ClientFactory, r18_trained_stats: ResNet) -> TestClient:
    torch.save(r18_trained_stats.state_dict(), tmp_path / "r18.pt")
    (tmp_path / "looped.py").write_text(LOOPED_PY)
    return make_client(CONFIG, device="cpu")


def test_info_says_which_path_predictions_take(client: TestClient) -> None:
    paths = {m["name"]: m["prediction_path"] for m in client.get("/models").json()["models"]}
    assert paths == {"r18": "fused", "r18_eager": "eager", "looped": "eager"}  # looped: FX cannot trace it


def test_fused_predictions_stay_within_1e4_of_the_model(client: TestClient, r18_trained_stats: ResNet) -> None:
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    body = {"model": "r18", "inputs": [tensor_input(t) for t in x], "include_logits": True}
    response = client.post("/predict", json=body)
    assert response.status_code == 200, response.text
    got = torch.tensor([p["logits"] for p in response.json()["predictions"]])
    with torch.inference_mode():
        want = r18_trained_stats(x)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)


def test_layers_and_hooks_see_the_unfused_model(client: TestClient, r18_trained_stats: ResNet) -> None:
    names = [layer["name"] for layer in client.get("/models/r18/layers").json()["layers"]]
    assert "bn1" in names
    assert "layer1.0.bn2" in names
    x = torch.randn(3, 64, 64, generator=torch.Generator().manual_seed(4))
    body = {"model": "r18", "inputs": [tensor_input(x)], "layers": ["bn1"]}
    response = client.post("/activations", json=body)
    assert response.status_code == 200, response.text
    got = torch.tensor(response.json()["activations"]["bn1"]["output"]["data"])
    with torch.inference_mode():
        want = r18_trained_stats.bn1(r18_trained_stats.conv1(x[None]))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert client.get("/models/r18").json()["hooks"] == 0
