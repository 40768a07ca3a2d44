"""`compile = true`: plain predictions go through torch.compile, introspection through the eager module."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from service.registry import loader
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


def test_compiled_model_predicts_like_eager_and_keeps_hooks_working(
    make_client: ClientFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiled: list[torch.nn.Module] = []
    real = loader.compile_module

    def spy(*args: object) -> torch.nn.Module:
        out = real(*args)  # type: ignore[arg-type]
        compiled.append(out)
        return out

    monkeypatch.setattr(loader, "COMPILE_BACKEND", "eager")  # the graph capture without inductor's C++ build
    monkeypatch.setattr(loader, "compile_module", spy)
    checkpoint = torch.load(weights_path(), weights_only=True)
    torch.save(checkpoint["model_state_dict"], tmp_path / "lenet.pt")
    client = make_client(CONFIG)
    assert client.get("/models/fast").json()["status"] == "ready"
    assert len(compiled) == 1
    eager = LeNet().eval()
    eager.load_state_dict(checkpoint["model_state_dict"])
    x = torch.rand(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    body = {"model": "fast", "inputs": [tensor_input(t) for t in x], "include_logits": True, "top_k": 1}
    r = client.post("/predict", json=body)
    assert r.status_code == 200, r.text
    got = torch.tensor([p["logits"] for p in r.json()["predictions"]])
    torch.testing.assert_close(got, eager(x).detach(), rtol=1e-5, atol=1e-5)
    acts = client.post("/activations", json={"model": "fast", "inputs": [tensor_input(x[0])], "layers": ["conv1"]})
    assert acts.status_code == 200
    assert acts.json()["activations"]["conv1"]["output"]["shape"] == [1, 6, 28, 28]
    assert client.get("/models/fast").json()["hooks"] == 0
