"""POST /gradients over HTTP against torch.autograd on the same models built in-process (hand-split forwards)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from fastapi.testclient import TestClient
from torch import Tensor
from torchvision.models import ResNet

from service.config import Settings
from service.main import create_app
from service.zoo.lenet import LeNet
from tests.conftest import (
    ClientFactory,
    as_tensor,
    b64,
    digit_pixels,
    hooks,
    read_binary_answer,
    sample_png,
    tensor_input,
    wait_settled,
    write_lenet,
)
from tests.helpers.config import toy_entry

PETS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def _config(root: Path) -> str:
    (root / "pets.txt").write_text("\n".join(PETS) + "\n")
    return (
        write_lenet(root, labels="digits.txt")
        + write_lenet(root, name="pets", labels="pets.txt")
        + '[[models]]\nname = "resnet18"\nsource = "torchvision"\narchitecture = "resnet18"\nweights = "r18.pt"\n'
    )


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory, r18: ResNet) -> Iterator[TestClient]:
    root = tmp_path_factory.mktemp("gradients")
    torch.save(r18.state_dict(), root / "r18.pt")
    (root / "models.toml").write_text(_config(root))
    settings = Settings(model_dir=root, config=root / "models.toml", device="cpu", worker_threads=2, torch_threads=1)
    with TestClient(create_app(settings)) as c:
        wait_settled(c)
        assert {m["name"]: m["status"] for m in c.get("/models").json()["models"]} == dict.fromkeys(
            ["lenet", "pets", "resnet18"], "ready"
        )
        yield c


def lenet_parts(m: LeNet, x: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """LeNet's forward split by hand: logits and the outputs the API names."""
    r1 = F.relu(m.conv1(x))
    c2 = m.conv2(m.pool(r1))
    r2 = F.relu(c2)
    r3 = F.relu(m.fc1(torch.flatten(m.pool(r2), 1)))
    r4 = F.relu(m.fc2(r3))
    return m.fc3(r4), {"relu": r1, "conv2": c2, "relu#2": r2, "relu#3": r3, "relu#4": r4}


def r18_parts(m: ResNet, x: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """resnet18's forward split by hand, layer1.0 unrolled so bn1's output is seen before its in-place ReLU."""
    h = m.maxpool(m.relu(m.bn1(m.conv1(x))))
    block = m.layer1[0]
    bn1 = block.bn1(block.conv1(h))
    h = F.relu(block.bn2(block.conv2(F.relu(bn1))) + h)
    a4 = m.layer4(m.layer3(m.layer2(m.layer1[1](h))))
    return m.fc(torch.flatten(m.avgpool(a4), 1)), {"layer1.0.bn1": bn1, "layer4": a4}


def expected(
    parts: Any, model: Any, x: Tensor, targets: list[int] | None, keys: list[str]
) -> tuple[list[int], list[float], dict[str, Tensor]]:
    """Targets (top-1 when None), target logits and d(sum_i logit[i, t_i])/d(each key and the input)."""
    x = x.clone().requires_grad_(True)
    logits, named = parts(model, x)
    chosen = targets if targets is not None else logits.argmax(1).tolist()
    scores = logits.gather(1, torch.tensor(chosen)[:, None])[:, 0]
    wrt = [named[k] for k in keys] + [x]
    grads = torch.autograd.grad(scores.sum(), wrt)
    return chosen, scores.tolist(), dict(zip([*keys, "input"], grads, strict=True))


def post(client: TestClient, **body: Any) -> dict[str, Any]:
    response = client.post("/gradients", json=body)
    assert response.status_code == 200, response.text[:500]
    out: dict[str, Any] = response.json()
    return out


def check_grads(got: dict[str, Any], want: dict[str, Tensor], scale_rtol: float = 1e-4) -> None:
    assert set(got) == set(want)
    for key, value in want.items():
        atol = scale_rtol * float(value.abs().max()) + 1e-7
        torch.testing.assert_close(as_tensor(got[key]), value, rtol=1e-3, atol=atol, msg=key)


def test_resnet18_layers_and_input_per_input_targets(client: TestClient, r18: ResNet) -> None:
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    out = post(
        client,
        model="resnet18",
        inputs=[tensor_input(x[0]), tensor_input(x[1], as_b64=True)],
        target=[3, 917],
        layers=["layer4", "layer1.0.bn1"],
    )
    targets, scores, want = expected(r18_parts, r18, x, [3, 917], ["layer1.0.bn1", "layer4"])
    assert out["model"] == "resnet18"
    assert out["targets"] == targets == [3, 917]
    np.testing.assert_allclose(out["scores"], scores, rtol=1e-4, atol=1e-5)
    assert list(out["gradients"]) == ["layer1.0.bn1", "layer4", "input"]  # forward order, then the input
    check_grads(out["gradients"], want)
    assert out["gradients"]["layer4"]["shape"] == [2, 512, 2, 2]
    assert hooks(client, "resnet18") == 0


def test_lenet_conv2_images_top1(client: TestClient, lenet: LeNet) -> None:
    out = post(
        client, model="lenet", inputs=[{"image": b64(sample_png(3))}, {"image": b64(sample_png(8))}], layers=["conv2"]
    )
    targets, scores, want = expected(
        lenet_parts, lenet, torch.stack([digit_pixels(3), digit_pixels(8)]), None, ["conv2"]
    )
    assert out["targets"] == targets == [3, 8]  # top-1 per input (the trained net reads both digits)
    np.testing.assert_allclose(out["scores"], scores, rtol=1e-5)
    check_grads(out["gradients"], want)


def test_shared_relu_reports_every_call(client: TestClient, lenet: LeNet) -> None:
    x = torch.stack([digit_pixels(1), digit_pixels(5)])
    out = post(client, model="lenet", inputs=[tensor_input(t) for t in x], target=[2, 6], layers=["relu"])
    _, _, want = expected(lenet_parts, lenet, x, [2, 6], ["relu", "relu#2", "relu#3", "relu#4"])
    assert list(out["gradients"]) == ["relu", "relu#2", "relu#3", "relu#4", "input"]
    check_grads(out["gradients"], want)


@pytest.mark.parametrize(
    ("model", "target", "index"),
    [("lenet", 7, 7), ("lenet", "7", 7), ("pets", "seven", 7), ("pets", ["seven", 2], [7, 2]), ("pets", 4, 4)],
)
def test_targets_by_index_and_label(
    client: TestClient, lenet: LeNet, model: str, target: Any, index: int | list[int]
) -> None:
    x = torch.stack([digit_pixels(0), digit_pixels(9)])
    indices = index if isinstance(index, list) else [index, index]
    out = post(client, model=model, inputs=[tensor_input(t) for t in x], target=target, layers=["fc2"])
    _, scores, want = expected(lenet_parts, lenet, x, indices, [])
    assert out["targets"] == indices
    np.testing.assert_allclose(out["scores"], scores, rtol=1e-5)
    assert list(out["gradients"]) == ["fc2", "input"]
    check_grads({"input": out["gradients"]["input"]}, {"input": want["input"]})


def test_include_input_false_leaves_input_out(client: TestClient, lenet: LeNet) -> None:
    out = post(
        client, model="lenet", inputs=[{"image": b64(sample_png(4))}], target=4, layers=["conv2"], include_input=False
    )
    _, _, want = expected(lenet_parts, lenet, digit_pixels(4)[None], [4], ["conv2"])
    assert list(out["gradients"]) == ["conv2"]
    check_grads(out["gradients"], {"conv2": want["conv2"]})


@pytest.mark.parametrize("fmt", ["safetensors", "npz"])
def test_binary_formats(client: TestClient, lenet: LeNet, fmt: str) -> None:
    x = torch.stack([digit_pixels(2), digit_pixels(6)])
    response = client.post(
        "/gradients",
        json={"model": "lenet", "inputs": [tensor_input(t) for t in x], "layers": ["conv2", "relu"], "format": fmt},
    )
    assert response.status_code == 200, response.text[:500]
    assert response.headers["content-type"] == "application/octet-stream"
    assert f'filename="gradients.{fmt}"' in response.headers["content-disposition"]
    tensors, meta = read_binary_answer(response.content, fmt)
    keys = ["relu", "conv2", "relu#2", "relu#3", "relu#4"]
    targets, scores, want = expected(lenet_parts, lenet, x, None, keys)
    assert set(tensors) == {*keys, "input"}
    for key, value in want.items():
        assert tensors[key].dtype == torch.float32
        torch.testing.assert_close(tensors[key], value, rtol=1e-3, atol=1e-4 * float(value.abs().max()) + 1e-7)
    assert meta["model"] == "lenet"
    assert meta["targets"] == targets == [2, 6]
    np.testing.assert_allclose(meta["scores"], scores, rtol=1e-5)
    assert meta["gradients"] == {k: {"shape": list(v.shape)} for k, v in want.items()}


def test_multipart_curl_style(client: TestClient, lenet: LeNet) -> None:
    files = [("image", ("a.png", sample_png(3), "image/png")), ("image", ("b.png", sample_png(8), "image/png"))]
    response = client.post(
        "/gradients",
        data={"model": "pets", "target": "five", "layers": "conv2,fc1", "include_input": "false"},
        files=files,
    )
    assert response.status_code == 200, response.text[:500]
    out = response.json()
    assert out["targets"] == [5, 5]  # one label for every image, not a one-item list
    _, _, want = expected(lenet_parts, lenet, torch.stack([digit_pixels(3), digit_pixels(8)]), [5, 5], ["conv2"])
    assert list(out["gradients"]) == ["conv2", "fc1"]
    check_grads({"conv2": out["gradients"]["conv2"]}, {"conv2": want["conv2"]})
    per_input = client.post("/gradients", data={"model": "lenet", "target": "1,2", "layers": "conv2"}, files=files)
    assert per_input.status_code == 200, per_input.text[:500]
    assert per_input.json()["targets"] == [1, 2]


@pytest.mark.parametrize(
    ("model", "body", "needle"),
    [
        ("lenet", {"target": 10, "layers": ["conv2"]}, "out of range"),
        ("lenet", {"target": -1, "layers": ["conv2"]}, "out of range"),
        ("resnet18", {"target": 1000, "layers": ["layer4"]}, "out of range"),
        ("lenet", {"target": "cat", "layers": ["conv2"]}, "unknown target label 'cat'"),
        ("pets", {"target": "sevn", "layers": ["conv2"]}, "'seven'"),
        ("pets", {"target": ["one", "two", "three"], "layers": ["conv2"]}, "3 entries but there are 2 inputs"),
        ("lenet", {"target": True}, "target"),
        ("lenet", {"layers": ["conv3"]}, "'conv2'"),
        ("lenet", {"layers": ["fc*x"]}, "matches no layer"),
        ("lenet", {"layers": [], "include_input": False}, "nothing to differentiate"),
        ("resnet18", {"layers": ["layer4"], "format": "png"}, "format"),
    ],
)
def test_invalid_fields_are_422_and_leave_no_hooks(
    client: TestClient, model: str, body: dict[str, Any], needle: str
) -> None:
    size = 32 if model != "resnet18" else 64
    inputs = [tensor_input(torch.zeros(3, size, size)), tensor_input(torch.ones(3, size, size))]
    response = client.post("/gradients", json={"model": model, "inputs": inputs, **body})
    assert response.status_code == 422, response.text[:500]
    assert needle in str(response.json()["detail"])
    assert hooks(client, model) == 0
    assert post(client, model=model, inputs=inputs[:1], layers=["conv1"])["targets"]  # still serving


def test_features_only_model_is_422_not_class_scores(builtin_client: TestClient) -> None:
    layers = [row["name"] for row in builtin_client.get("/models/efficientvit_b0/layers").json()["layers"]]
    response = builtin_client.post(
        "/gradients",
        json={
            "model": "efficientvit_b0",
            "inputs": [tensor_input(torch.zeros(3, 64, 64))],
            "layers": [layers[1]],
        },
    )
    assert response.status_code == 422, response.text[:500]
    assert "not class scores" in response.json()["detail"]
    assert hooks(builtin_client, "efficientvit_b0") == 0


def test_unknown_model_is_404(client: TestClient) -> None:
    response = client.post("/gradients", json={"model": "nope", "inputs": [tensor_input(torch.zeros(3, 32, 32))]})
    assert response.status_code == 404


def test_a_shape_the_model_cannot_take_is_422(client: TestClient, r18: ResNet) -> None:
    response = client.post(
        "/gradients", json={"model": "lenet", "inputs": [tensor_input(torch.zeros(3, 40, 40))], "layers": ["conv2"]}
    )
    assert response.status_code == 422, response.text[:500]
    assert "cannot run on samples of shape [3, 40, 40]" in response.json()["detail"]
    assert hooks(client, "lenet") == 0
    x = torch.rand(1, 3, 40, 48, generator=torch.Generator().manual_seed(4))  # resnet18 takes any size
    out = post(client, model="resnet18", inputs=[tensor_input(x[0])], target=5, layers=["layer4"])
    _, _, want = expected(r18_parts, r18, x, [5], ["layer4"])
    check_grads(out["gradients"], {"layer4": want["layer4"], "input": want["input"]})


def test_device_oom_is_503_and_the_model_keeps_serving(make_client: ClientFactory, tmp_path: Path) -> None:
    (tmp_path / "probe.py").write_text(PROBE)
    client = make_client(
        '[[models]]\nname = "probe"\nsource = "python"\narchitecture = "probe.py:Probe"\ninput_size = [3, 8, 8]\n',
        device="cpu",
        worker_threads=1,
        torch_threads=1,
    )
    flagged = torch.zeros(3, 8, 8)
    flagged[0, 0, 0] = 5000.0
    response = client.post("/gradients", json={"model": "probe", "inputs": [tensor_input(flagged)], "layers": ["conv"]})
    assert response.status_code == 503, response.text[:500]
    assert "out of memory" in response.json()["detail"]
    assert int(response.headers["retry-after"]) >= 1
    assert hooks(client, "probe") == 0
    out = post(client, model="probe", inputs=[tensor_input(torch.ones(3, 8, 8))], layers=["conv"])
    assert list(out["gradients"]) == ["conv", "input"]
    assert hooks(client, "probe") == 0


PROBE = '''
import torch
from torch import nn


class Probe(nn.Module):
    """conv-relu-linear on 3x8x8; a first pixel over 1000 fakes a device out-of-memory error under autograd."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 8 * 8, 5)

    def forward(self, x):
        if torch.is_grad_enabled() and bool((x[:, 0, 0, 0] > 1000).any()):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return self.fc(torch.relu(self.conv(x)).flatten(1))
'''


def test_a_reentrant_module_numbers_its_calls_in_the_order_they_begin(make_client: ClientFactory) -> None:
    """logits = nest = 2 nest#2 = 4 nest#3 (`tests.helpers.models.Reentrant`): the gradients are 1, 2 and 4 times
    the target's one-hot, under the names of the calls in the order they began."""
    client = make_client(toy_entry("reentrant", "Reentrant"))
    x = torch.tensor([1.0, 2.0, -3.0, 0.5])
    body = {"model": "reentrant", "inputs": [tensor_input(x)], "layers": ["nest"], "target": 1}
    r = client.post("/gradients", json=body)
    assert r.status_code == 200, r.text
    got = {key: as_tensor(t)[0] for key, t in r.json()["gradients"].items()}
    one_hot = torch.tensor([0.0, 1.0, 0.0, 0.0])
    assert got.keys() == {"nest", "nest#2", "nest#3", "input"}
    assert torch.equal(got["nest"], one_hot)
    assert torch.equal(got["nest#2"], 2 * one_hot)
    assert torch.equal(got["nest#3"], 4 * one_hot)
    assert torch.equal(got["input"], 8 * one_hot)
