"""CUDA paths: run where a GPU exists (skipped elsewhere). Compare every answer with the CPU's."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from PIL import Image
from skimage import data as skdata

from tests.conftest import ClientFactory, b64, tensor_input

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

CONFIG = """
[[models]]
name = "cpu"
source = "torchvision"
architecture = "resnet18"
weights = "r18.pt"
device = "cpu"

[[models]]
name = "gpu"
source = "torchvision"
architecture = "resnet18"
weights = "r18.pt"
device = "cuda"

[[models]]
name = "gpu_bf16"
source = "torchvision"
architecture = "resnet18"
weights = "r18.pt"
device = "cuda"
dtype = "bfloat16"
"""


@pytest.fixture
def client(make_client: ClientFactory, tmp_path: Path) -> TestClient:
    import torchvision

    torch.manual_seed(0)
    torch.save(torchvision.models.resnet18().state_dict(), tmp_path / "r18.pt")
    return make_client(CONFIG)


def _jpeg() -> str:
    buffer = io.BytesIO()
    Image.fromarray(skdata.chelsea()).save(buffer, format="JPEG", quality=90)
    return b64(buffer.getvalue())


def test_gpu_predictions_match_cpu(client: TestClient) -> None:
    x = torch.rand(3, 224, 224, generator=torch.Generator().manual_seed(0))
    logits = {}
    for name in ("cpu", "gpu", "gpu_bf16"):
        r = client.post("/predict", json={"model": name, "inputs": [tensor_input(x)], "include_logits": True})
        assert r.status_code == 200, r.text
        logits[name] = torch.tensor(r.json()["predictions"][0]["logits"])
    torch.testing.assert_close(logits["gpu"], logits["cpu"], rtol=1e-3, atol=1e-3)
    assert (logits["gpu_bf16"] - logits["cpu"]).abs().max() < 0.5


def test_gpu_jpeg_decode_matches_cpu_path(client: TestClient) -> None:
    image = _jpeg()
    out = {}
    for name in ("cpu", "gpu"):
        r = client.post("/predict", json={"model": name, "inputs": [{"image": image}], "include_logits": True})
        assert r.status_code == 200, r.text
        out[name] = torch.tensor(r.json()["predictions"][0]["logits"])
    assert (out["gpu"] - out["cpu"]).abs().max() < 0.05


def test_gpu_introspection_leaves_no_hooks(client: TestClient) -> None:
    x = tensor_input(torch.rand(3, 64, 64, generator=torch.Generator().manual_seed(1)))
    requests: list[tuple[str, dict[str, Any]]] = [
        ("/activations", {"layers": ["layer1.*"], "format": "stats"}),
        ("/gradients", {"layers": ["layer4"], "target": 3}),
        ("/saliency", {"method": "gradcam"}),
        ("/saliency", {"method": "integrated_gradients", "steps": 16}),
    ]
    for path, body in requests:
        r = client.post(path, json={"model": "gpu", "inputs": [x], **body})
        assert r.status_code == 200, (path, r.text)
    assert client.get("/models/gpu").json()["hooks"] == 0
