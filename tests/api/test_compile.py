"""`compile = true`: plain predictions run through the compiled copy, hooked requests through the eager module."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from service.registry import fast_path
from service.registry.probes import Placement
from service.zoo.lenet import LeNet, weights_path
from tests.conftest import ClientFactory, tensor_input

CONFIG = """
[[models]]
name = "fast"
source = "python"
architecture = "service.zoo.lenet:LeNet"
weights = "lenet.pt"
input_size = [3, 32, 32]
compile = true
"""


class Counted(nn.Module):
    """The compiled module, counting the forwards that reach it."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        out: torch.Tensor = self.inner(x)
        return out


def test_predictions_go_through_the_compiled_module_and_hooked_requests_do_not(
    make_client: ClientFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiled: list[Counted] = []
    real = fast_path.compile_module

    def spy(module: nn.Module, placement: Placement) -> nn.Module:
        counted = Counted(real(module, placement))
        compiled.append(counted)
        return counted

    monkeypatch.setattr(fast_path, "COMPILE_BACKEND", "eager")  # the graph capture without inductor's C++ build
    monkeypatch.setattr(fast_path, "compile_module", spy)
    checkpoint = torch.load(weights_path(), weights_only=True)
    torch.save(checkpoint["model_state_dict"], tmp_path / "lenet.pt")
    client = make_client(CONFIG)
    info = client.get("/models/fast").json()
    assert (info["status"], info["prediction_path"]) == ("ready", "compiled")
    assert len(compiled) == 1
    counted = compiled[0]
    eager = LeNet().eval()
    eager.load_state_dict(checkpoint["model_state_dict"])
    x = torch.rand(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))

    before = counted.calls
    body = {"model": "fast", "inputs": [tensor_input(t) for t in x], "include_logits": True, "top_k": 1}
    r = client.post("/predict", json=body)
    assert r.status_code == 200, r.text
    assert counted.calls > before  # the compiled module answered
    got = torch.tensor([p["logits"] for p in r.json()["predictions"]])
    torch.testing.assert_close(got, eager(x).detach(), rtol=1e-5, atol=1e-5)

    before = counted.calls
    acts = client.post("/activations", json={"model": "fast", "inputs": [tensor_input(x[0])], "layers": ["conv1"]})
    grads = client.post("/gradients", json={"model": "fast", "inputs": [tensor_input(x[0])], "layers": ["fc1"]})
    cam = client.post("/saliency", json={"model": "fast", "inputs": [tensor_input(x[0])], "method": "gradcam"})
    assert (acts.status_code, grads.status_code, cam.status_code) == (200, 200, 200)
    assert counted.calls == before  # hooks only ever on the eager module
    assert acts.json()["activations"]["conv1"]["output"]["shape"] == [1, 6, 28, 28]
    assert client.get("/models/fast").json()["hooks"] == 0
