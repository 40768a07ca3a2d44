"""Plain predictions of float32 CPU models run on ONNX Runtime; other inputs and every hooked request run in torch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from torchvision.models import ResNet

from tests.api.test_prediction_path import LOOPED_PY, resnet18_with_statistics
from tests.conftest import ClientFactory, as_tensor, tensor_input
from tests.helpers.captum_reference import captum
from tests.helpers.onnx_rows import count_onnx_rows

CONFIG = """
[[models]]
name = "r18"
source = "torchvision"
architecture = "resnet18"
weights = "r18.pt"
input_size = [3, 64, 64]

[[models]]
name = "r18_torch"
source = "torchvision"
architecture = "resnet18"
weights = "r18.pt"
input_size = [3, 64, 64]
onnxruntime = false

[[models]]
name = "pair"
source = "python"
architecture = "pair.py:Pair"
input_size = [4]

[[models]]
name = "looped"
source = "python"
architecture = "looped.py:Looped"
input_size = [3, 8, 8]
"""

PAIR_PY = """
import torch
from torch import nn

class Pair(nn.Module):
    '''Two outputs: the prediction path takes one tensor.'''

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x), x.sum(1)
"""


@pytest.fixture(scope="module")
def r18() -> ResNet:
    return resnet18_with_statistics()


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The batch size of every forward that reaches ONNX Runtime."""
    return count_onnx_rows(monkeypatch)


@pytest.fixture
def files(tmp_path: Path, r18: ResNet) -> None:
    torch.save(r18.state_dict(), tmp_path / "r18.pt")
    (tmp_path / "pair.py").write_text(PAIR_PY)
    (tmp_path / "looped.py").write_text(LOOPED_PY)


def predict(client: TestClient, model: str, x: torch.Tensor) -> torch.Tensor:
    body = {"model": model, "inputs": [tensor_input(t) for t in x], "include_logits": True}
    response = client.post("/predict", json=body)
    assert response.status_code == 200, response.text
    return torch.tensor([p["logits"] for p in response.json()["predictions"]])


def test_info_says_which_models_predict_on_onnxruntime_and_why_not(files: None, make_client: ClientFactory) -> None:
    models = {m["name"]: m for m in make_client(CONFIG).get("/models").json()["models"]}
    assert {name: m["prediction_path"] for name, m in models.items()} == {
        "r18": "onnxruntime",
        "r18_torch": "fused",
        "pair": "eager",
        "looped": "eager",
    }
    assert models["r18"]["prediction_path_reason"] is None
    assert models["r18_torch"]["prediction_path_reason"] is None  # turned off by its config: nothing to explain
    assert "does not return one tensor" in models["pair"]["prediction_path_reason"]
    assert "reads a tensor as a Python value" in models["looped"]["prediction_path_reason"]


def test_the_server_setting_is_the_default_a_model_config_overrides(files: None, make_client: ClientFactory) -> None:
    config = CONFIG.replace("onnxruntime = false", "onnxruntime = true")
    models = make_client(config, onnxruntime=False).get("/models").json()["models"]
    paths = {m["name"]: m["prediction_path"] for m in models}
    assert (paths["r18"], paths["r18_torch"]) == ("fused", "onnxruntime")


def test_predictions_run_on_onnxruntime_within_1e4_of_the_model(
    files: None, make_client: ClientFactory, r18: ResNet, runs: list[int]
) -> None:
    client = make_client(CONFIG)
    runs.clear()  # the load's own checks
    x = torch.randn(3, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    got = predict(client, "r18", x)
    assert sum(runs) == 3  # every sample went through the runtime
    with torch.inference_mode():
        want = r18(x)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
    torch.testing.assert_close(predict(client, "r18_torch", x), want, rtol=0, atol=1e-4)
    assert sum(runs) == 3  # the torch path's model never reaches it


def test_inputs_of_another_size_run_on_the_torch_path(
    files: None, make_client: ClientFactory, r18: ResNet, runs: list[int]
) -> None:
    client = make_client(CONFIG)
    runs.clear()
    x = torch.randn(2, 3, 40, 48, generator=torch.Generator().manual_seed(5))  # exported for 64 x 64
    got = predict(client, "r18", x)
    assert runs == []
    with torch.inference_mode():
        want = r18(x)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)


def test_hooked_requests_see_the_model_and_never_the_runtime(
    files: None, make_client: ClientFactory, r18: ResNet, runs: list[int]
) -> None:
    client = make_client(CONFIG)
    runs.clear()
    x = torch.randn(3, 64, 64, generator=torch.Generator().manual_seed(4))
    body = {"model": "r18", "inputs": [tensor_input(x)], "layers": ["bn1", "fc"]}
    response = client.post("/activations", json=body)
    assert response.status_code == 200, response.text
    activations = response.json()["activations"]
    with torch.inference_mode():
        want_bn1 = r18.bn1(r18.conv1(x[None]))
        want_fc = r18(x[None])
    torch.testing.assert_close(torch.tensor(activations["bn1"]["output"]["data"]), want_bn1, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(torch.tensor(activations["fc"]["output"]["data"]), want_fc, rtol=1e-4, atol=1e-4)
    assert runs == []
    assert client.get("/models/r18").json()["hooks"] == 0


def attributions(client: TestClient, model: str, x: torch.Tensor, **params: Any) -> torch.Tensor:
    body = {"model": model, "inputs": [tensor_input(t) for t in x], "target": [1, 7], **params}
    response = client.post("/saliency", json=body)
    assert response.status_code == 200, response.text
    return torch.stack([as_tensor(r["attribution"]) for r in response.json()["results"]])


@pytest.mark.parametrize(
    ("params", "captum_method"),
    [
        ({"method": "occlusion", "window": [16, 16], "strides": [16, 16]}, "occlusion"),
        ({"method": "feature_ablation", "groups": "grid", "cell": [16, 16]}, "feature_ablation"),
    ],
)
def test_perturbation_methods_run_their_forwards_on_onnxruntime_and_equal_captum(
    *,
    files: None,
    make_client: ClientFactory,
    r18: ResNet,
    runs: list[int],
    params: dict[str, Any],
    captum_method: str,
) -> None:
    """Occlusion and feature ablation need neither hooks nor autograd: their perturbed copies go through the
    prediction path (ONNX Runtime here, the fused copy for r18_torch), and the maps still equal Captum's on the model
    within what loading checked the path against (1e-4 a score, so 2e-4 a difference of two)."""
    client = make_client(CONFIG)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(6))
    reference = {"window": [16, 16], "strides": [16, 16], "baseline": 0.0} if captum_method == "occlusion" else {}
    reference |= {"cell": [16, 16], "baseline": 0.0} if captum_method == "feature_ablation" else {}
    want, _ = captum(r18, x, captum_method, reference, [1, 7])
    for model, on_runtime in (("r18", True), ("r18_torch", False)):
        runs.clear()
        got = attributions(client, model, x, **params)
        torch.testing.assert_close(got, want.detach(), rtol=1e-3, atol=2e-4)
        # the class scores, then each input's 16 occluded copies and its unperturbed row (Captum's own first forward)
        assert sum(runs) == (2 + 2 * (16 + 1) if on_runtime else 0), runs
    runs.clear()
    attributions(client, "r18", x, method="gradient")  # a gradient needs autograd: never the runtime
    assert runs == []
    assert client.get("/models/r18").json()["hooks"] == 0
