"""Packed convolution weights: hooked answers bit-identical to torch's own, INFO says when they are used."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient

from service.config import Settings
from service.main import create_app
from service.registry.packed_convolutions import ConvCall, ConvPacks
from tests.conftest import tensor_input, wait_settled

NET_PY = """
import torch
from torch import nn

class Net(nn.Module):
    '''Strided, dilated, grouped, 1x1 and reflect-padded convolutions, a residual add and in-place ReLUs.'''

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 5, stride=2, padding=2)
        self.bn = nn.BatchNorm2d(8)
        self.relu = nn.ReLU(inplace=True)
        self.grouped = nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=4)
        self.reflect = nn.Conv2d(8, 8, 3, padding=1, padding_mode="reflect")
        self.point = nn.Conv2d(8, 16, 1, bias=False)
        self.fc = nn.Linear(16, 5)

    def forward(self, x):
        x = self.relu(self.bn(self.stem(x)))
        x = self.relu(x + self.reflect(self.grouped(x)))
        return self.fc(self.point(x).mean((2, 3)))
"""


def model(name: str, **extra: str) -> str:
    lines = [f'name = "{name}"', 'source = "python"', 'architecture = "net.py:Net"', 'weights = "net.pt"']
    lines += ["input_size = [3, 24, 24]", *(f"{k} = {v}" for k, v in extra.items())]
    return "[[models]]\n" + "\n".join(lines) + "\n"


CONFIG = (
    model("packed")
    + model("plain", packed_convolutions="false")
    + model("nchw", memory_format='"contiguous"')
    + model("eager_predictions", onnxruntime="false", fuse="false")
    + model("fused_predictions", onnxruntime="false")
)
MODELS = ("packed", "plain", "nchw", "eager_predictions", "fused_predictions")
LAYERS = ["stem", "relu", "grouped", "reflect", "point"]


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    folder = tmp_path_factory.mktemp("packed")
    (folder / "net.py").write_text(NET_PY)
    namespace: dict[str, Any] = {}
    exec(NET_PY, namespace)
    net = namespace["Net"]()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for tensor in net.state_dict().values():
            if tensor.is_floating_point():
                tensor.uniform_(-0.5, 0.5, generator=generator)
        net.bn.running_var.uniform_(0.5, 2.0, generator=generator)
    torch.save(net.state_dict(), folder / "net.pt")
    (folder / "models.toml").write_text(CONFIG)
    with TestClient(create_app(Settings(model_dir=folder, config=folder / "models.toml", device="cpu"))) as c:
        wait_settled(c)
        yield c


@pytest.fixture
def packed_calls(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of this module's model for every conv2d call served from its packed weights (on any thread);
    other servers' models, loading beside these tests, are not counted."""
    fleet = client.app.state.hookserve.fleet  # type: ignore[attr-defined]
    owners = {id(packs): name for name in MODELS if (packs := fleet.ready(name).model.conv_packs) is not None}
    calls: list[str] = []
    real = ConvPacks.run

    def spy(self: ConvPacks, call: ConvCall) -> torch.Tensor | None:
        out = real(self, call)
        if out is not None and id(self) in owners:
            calls.append(owners[id(self)])
        return out

    monkeypatch.setattr(ConvPacks, "run", spy)
    return calls


def inputs(count: int = 3, seed: int = 7) -> list[dict[str, Any]]:
    x = torch.randn(count, 3, 24, 24, generator=torch.Generator().manual_seed(seed))
    return [tensor_input(t) for t in x]


def answer(client: TestClient, path: str, name: str, **body: Any) -> dict[str, Any]:
    response = client.post(path, json={"model": name, "inputs": inputs(), **body})
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return {k: v for k, v in result.items() if k != "model"}  # the rest must match between the twins


def test_info_says_whether_convolutions_are_packed(client: TestClient) -> None:
    info = {m["name"]: m for m in client.get("/models").json()["models"]}
    assert info["packed"]["packed_convolutions"] is True
    assert info["packed"]["packed_convolutions_reason"] is None
    assert info["plain"]["packed_convolutions"] is False
    assert info["plain"]["packed_convolutions_reason"] == "packed_convolutions = false"
    assert info["nchw"]["packed_convolutions"] is False
    assert "NCHW" in info["nchw"]["packed_convolutions_reason"]


@pytest.mark.parametrize(
    ("path", "body", "packed_convolutions"),
    [
        ("/activations", {"layers": LAYERS}, 4),  # every convolution of the forward (the 4 of `Net`) per batch
        ("/activations", {"layers": ["relu", "point"], "reduce": "mean"}, 4),
        ("/gradients", {"layers": ["grouped", "point"], "target": 2, "include_input": False}, 2),  # stem, grouped
        ("/gradients", {"layers": ["reflect"], "include_input": False}, 3),  # up to the layer's output
        ("/gradients", {"layers": ["reflect"], "include_input": True}, 0),  # input gradients: all record autograd
        ("/saliency", {"method": "gradcam", "layer": "grouped"}, 2),
        ("/saliency", {"method": "gradient"}, 0),
    ],
)
def test_hooked_answers_are_bit_identical_to_unpacked_ones(
    client: TestClient, packed_calls: list[str], path: str, body: dict[str, Any], packed_convolutions: int
) -> None:
    """Only convolutions that record no autograd run on packs: up to the earliest differentiated layer's output."""
    plain = answer(client, path, "plain", **body)
    assert packed_calls == []
    packed = answer(client, path, "packed", **body)
    assert packed == plain
    assert packed_calls == ["packed"] * packed_convolutions
    assert client.get("/models/packed").json()["hooks"] == 0


@pytest.mark.parametrize(("name", "path"), [("eager_predictions", "eager"), ("fused_predictions", "fused")])
def test_predictions_on_torch_modules_use_packs_too(
    client: TestClient, packed_calls: list[str], name: str, path: str
) -> None:
    """The served module's packs, and a fused copy's own (its folded weights are other tensors)."""
    assert client.get(f"/models/{name}").json()["prediction_path"] == path
    answer(client, "/predict", name)
    assert packed_calls == [name] * 4


def test_batched_packed_answers_equal_answers_alone(client: TestClient) -> None:
    """Concurrent requests batched into one packed forward get what each would get alone."""
    from concurrent.futures import ThreadPoolExecutor

    bodies = [
        {"model": "packed", "inputs": inputs(2, seed), "layers": LAYERS[i % 5 :]} for i, seed in enumerate(range(8))
    ]
    alone = [client.post("/activations", json=b).json()["activations"] for b in bodies]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda b: client.post("/activations", json=b).json()["activations"], bodies))
    assert together == alone
