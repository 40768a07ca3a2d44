"""POST /activations through the ASGI app, each option against hooks registered directly in the test."""

from __future__ import annotations

import importlib.util
import io
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import timm
import torch
import torchvision
from fastapi.testclient import TestClient
from PIL import Image
from torch import Tensor, nn

from service.codecs.pictures import feature_grid_png
from service.config import Settings
from service.main import create_app
from service.zoo.lenet import load_lenet
from tests.conftest import (
    ClientFactory,
    as_tensor,
    assert_served_copies_clean,
    b64,
    digit_pixels,
    direct_capture,
    read_binary_answer,
    sample_png,
    tensor_input,
    wait_settled,
    write_lenet,
)
from tests.helpers.compare import assert_same_predictions
from tests.helpers.config import toy_entry

# A python model (file.py:Class under the model dir): a layer returning a tuple, one taking two
# positional tensors, and one that raises for huge inputs (a model bug, not a client mistake).
TOY_PY = """
import torch
from torch import nn


class Split(nn.Module):
    def forward(self, x):
        return x[:, :2], x[:, 2:]


class Pair(nn.Module):
    def forward(self, a, b):
        return torch.cat([a.relu(), b.sigmoid()], dim=1)


class Boom(nn.Module):
    def forward(self, x):
        if x.sum() > 1e6:
            raise RuntimeError("boom: secret internal failure")
        return x


class Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.boom = Boom()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.split = Split()
        self.pair = Pair()
        self.fc = nn.Linear(4, 3)
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)

    def forward(self, x):
        a, b = self.split(self.conv(self.boom(x)))
        return self.fc(self.pair(a, b).mean(dim=(2, 3)))
"""

TOY_TOML = """
[[models]]
name = "toy"
source = "python"
architecture = "toy.py:Toy"
input_size = [4, 6, 6]
"""


# ---- helpers ------------------------------------------------------------------------------


def served(client: TestClient, name: str) -> nn.Module:
    """The module the server holds (read only by the tests, between requests)."""
    app: Any = client.app
    module: nn.Module = app.state.hookserve.fleet.ready(name).model.module
    return module


def assert_no_hooks(client: TestClient, name: str) -> None:
    assert client.get(f"/models/{name}").json()["hooks"] == 0
    assert_served_copies_clean(client.app, name)


def assert_same(got: dict[str, dict[str, Any]], want: dict[str, dict[str, Tensor]]) -> None:
    assert list(got) == list(want)  # in the order the hooks fired
    for key, sides in want.items():
        assert sorted(got[key]) == sorted(sides), key
        for side, expected in sides.items():
            actual = as_tensor(got[key][side])
            assert actual.shape == expected.shape, (key, side)
            torch.testing.assert_close(actual, expected, rtol=0, atol=1e-6, msg=f"{key}:{side}")


def post_activations(client: TestClient, **body: Any) -> dict[str, Any]:
    response = client.post("/activations", json=body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def load_toy_module(path: Path) -> nn.Module:
    spec = importlib.util.spec_from_file_location("toy_reference", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    toy: nn.Module = module.Toy().eval()
    return toy


@contextmanager
def toy_client(tmp_path: Path) -> Iterator[TestClient]:
    """The toy model, with server exceptions turned into responses (the way a real client sees them)."""
    (tmp_path / "toy.py").write_text(TOY_PY)
    (tmp_path / "models.toml").write_text(TOY_TOML)
    settings = Settings(model_dir=tmp_path, config=tmp_path / "models.toml", worker_threads=1)
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        wait_settled(client)
        yield client


@pytest.fixture(scope="module")
def lenet() -> nn.Module:
    return load_lenet()


@pytest.fixture(scope="module")
def resnet(builtin_client: TestClient) -> nn.Module:
    model: nn.Module = torchvision.models.resnet18()
    model.load_state_dict(served(builtin_client, "resnet18").state_dict())
    return model.eval()


# ---- names, patterns, capture sides ----------------------------------------------------------


def test_exact_names_equal_direct_hooks_and_predictions_equal_predict(
    builtin_client: TestClient, lenet: nn.Module
) -> None:
    digits = [3, 7]
    x = torch.stack([digit_pixels(d) for d in digits])
    inputs = [{"image": b64(sample_png(d))} for d in digits]
    body = post_activations(builtin_client, model="lenet", inputs=inputs, layers=["conv1", "fc3"])
    assert body["model"] == "lenet"
    assert list(body["activations"]) == ["conv1", "fc3"]
    assert_same(body["activations"], direct_capture(lenet, ["conv1", "fc3"], x))
    assert [list(v) for v in body["activations"].values()] == [["output"], ["output"]]
    predicted = builtin_client.post("/predict", json={"model": "lenet", "inputs": inputs, "top_k": 5}).json()
    assert_same_predictions(body["predictions"], predicted["predictions"])
    assert [p["top_k"][0]["index"] for p in body["predictions"]] == digits
    assert all(len(p["top_k"]) == 5 for p in body["predictions"])
    assert_no_hooks(builtin_client, "lenet")


def test_fnmatch_patterns(builtin_client: TestClient, lenet: nn.Module, resnet: nn.Module) -> None:
    x = digit_pixels(5)[None]
    body = post_activations(builtin_client, model="lenet", inputs=[tensor_input(x[0])], layers=["fc*"])
    assert list(body["activations"]) == ["fc1", "fc2", "fc3"]
    assert_same(body["activations"], direct_capture(lenet, ["fc1", "fc2", "fc3"], x))

    image = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    body = post_activations(builtin_client, model="resnet18", inputs=[tensor_input(image[0])], layers=["layer1.*"])
    names = [n for n, _ in resnet.named_modules() if n.startswith("layer1.")]
    assert len(names) == 12  # 2 blocks: the block, conv1, bn1, relu, conv2, bn2
    want = direct_capture(resnet, names, image)
    assert "layer1.0.relu#2" in want  # BasicBlock calls its ReLU twice
    assert sorted(body["activations"]) == sorted(want)
    assert_same(body["activations"], want)
    assert_no_hooks(builtin_client, "resnet18")


@pytest.mark.parametrize(
    ("model", "layers", "closest"),
    [
        ("lenet", ["conv3"], ["'conv1'", "'conv2'"]),
        ("lenet", ["conv1", "fc9"], ["'fc1'", "'fc2'", "'fc3'"]),
        ("resnet18", ["layer1.0.con1"], ["'layer1.0.conv1'"]),
        ("resnet18", ["layer9.*"], ["pattern 'layer9.*' matches no layer"]),
    ],
)
def test_unknown_layer_is_422_naming_closest(
    builtin_client: TestClient, model: str, layers: list[str], closest: list[str]
) -> None:
    x = torch.zeros(3, 32, 32)
    response = builtin_client.post("/activations", json={"model": model, "inputs": [tensor_input(x)], "layers": layers})
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert isinstance(detail, str)
    for name in closest:
        assert name in detail
    assert "unknown layer 'conv1'" not in detail  # only the wrong names are reported
    assert_no_hooks(builtin_client, model)


def test_capture_input_output_both(builtin_client: TestClient, lenet: nn.Module) -> None:
    x = torch.stack([digit_pixels(0), digit_pixels(9)])
    inputs = [tensor_input(t, as_b64=True) for t in x]
    for capture in ("input", "output", "both"):
        body = post_activations(builtin_client, model="lenet", inputs=inputs, layers=["pool", "fc1"], capture=capture)
        want = direct_capture(lenet, ["pool", "fc1"], x, capture)
        assert sorted(body["activations"]) == ["fc1", "pool", "pool#2"]
        assert_same(body["activations"], want)
        sides = {"input": ["input"], "output": ["output"], "both": ["input", "output"]}[capture]
        assert all(sorted(v) == sides for v in body["activations"].values())
    # fc1's input is the flattened second pooling output
    both = post_activations(builtin_client, model="lenet", inputs=inputs, layers=["pool", "fc1"], capture="both")
    flat = as_tensor(both["activations"]["pool#2"]["output"]).flatten(1)
    assert torch.equal(as_tensor(both["activations"]["fc1"]["input"]), flat)


def test_shared_relu_reports_every_call(builtin_client: TestClient, lenet: nn.Module) -> None:
    x = digit_pixels(4)[None]
    body = post_activations(builtin_client, model="lenet", inputs=[tensor_input(x[0])], layers=["relu"])
    assert list(body["activations"]) == ["relu", "relu#2", "relu#3", "relu#4"]
    shapes = [v["output"]["shape"] for v in body["activations"].values()]
    assert shapes == [[1, 6, 28, 28], [1, 16, 10, 10], [1, 120], [1, 84]]
    assert_same(body["activations"], direct_capture(lenet, ["relu"], x))


def test_tuple_outputs_and_multi_output_model(builtin_client: TestClient) -> None:
    ref = timm.create_model("efficientvit_b0", features_only=True)
    ref.load_state_dict(served(builtin_client, "efficientvit_b0").state_dict())
    ref.eval()
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    body = post_activations(builtin_client, model="efficientvit_b0", inputs=[tensor_input(x[0])], layers=[""])
    assert list(body["activations"]) == [".0", ".1", ".2", ".3"]
    assert body["predictions"] is None  # a list of feature maps, not class scores
    with torch.no_grad():
        features = ref(x)
    assert [t.shape[1] for t in features] == [16, 32, 64, 128]
    for i, feature in enumerate(features):
        torch.testing.assert_close(as_tensor(body["activations"][f".{i}"]["output"]), feature, rtol=0, atol=1e-5)
    assert_no_hooks(builtin_client, "efficientvit_b0")


def test_tuple_output_and_several_positional_inputs_of_a_python_model(tmp_path: Path) -> None:
    with toy_client(tmp_path) as client:
        ref = load_toy_module(tmp_path / "toy.py")
        x = torch.randn(2, 4, 6, 6, generator=torch.Generator().manual_seed(3))
        inputs = [tensor_input(t) for t in x]
        body = post_activations(client, model="toy", inputs=inputs, layers=["split", "pair", ""], capture="both")
        want = direct_capture(ref, ["", "split", "pair"], x, "both")
        assert sorted(body["activations"]) == ["", "pair", "pair.0", "pair.1", "split", "split.0", "split.1"]
        assert sorted(body["activations"]["split.0"]) == ["output"]
        assert sorted(body["activations"]["pair.1"]) == ["input"]
        assert_same(body["activations"], want)
        with torch.no_grad():
            logits = ref(x)
        top = [p["top_k"][0]["index"] for p in body["predictions"]]
        assert top == logits.argmax(1).tolist()
        assert_no_hooks(client, "toy")


# ---- reduce and formats ------------------------------------------------------------------------


@pytest.mark.parametrize("reduce", ["mean", "max", "flatten"])
def test_reduce(builtin_client: TestClient, lenet: nn.Module, reduce: str) -> None:
    x = torch.stack([digit_pixels(1), digit_pixels(2)])
    inputs = [tensor_input(t) for t in x]
    body = post_activations(builtin_client, model="lenet", inputs=inputs, layers=["conv2", "fc1"], reduce=reduce)
    want = direct_capture(lenet, ["conv2", "fc1"], x)
    conv2, fc1 = want["conv2"]["output"], want["fc1"]["output"]
    expected = {
        "mean": (conv2.mean(dim=(2, 3)), fc1),
        "max": (conv2.amax(dim=(2, 3)), fc1),
        "flatten": (conv2.reshape(2, -1), fc1),
    }[reduce]
    got_conv2 = as_tensor(body["activations"]["conv2"]["output"])
    got_fc1 = as_tensor(body["activations"]["fc1"]["output"])
    assert list(got_conv2.shape) == ([2, 1600] if reduce == "flatten" else [2, 16])
    torch.testing.assert_close(got_conv2, expected[0], rtol=0, atol=1e-6)
    assert torch.equal(got_fc1, expected[1])  # no spatial dims: unchanged


def test_format_stats(builtin_client: TestClient, lenet: nn.Module) -> None:
    x = torch.stack([digit_pixels(6), digit_pixels(8)])
    inputs = [tensor_input(t) for t in x]
    body = post_activations(builtin_client, model="lenet", inputs=inputs, layers=["relu", "conv1"], format="stats")
    want = direct_capture(lenet, ["relu", "conv1"], x)
    assert sorted(body["activations"]) == sorted(want)
    for key, sides in want.items():
        t = sides["output"].double()
        stats = body["activations"][key]["output"]
        assert stats["shape"] == list(t.shape)
        assert stats["dtype"] == "float32"
        assert set(stats) == {"shape", "dtype", "min", "max", "mean", "std", "zero_fraction"}
        assert stats["min"] == pytest.approx(t.min().item(), abs=1e-6)
        assert stats["max"] == pytest.approx(t.max().item(), abs=1e-6)
        assert stats["mean"] == pytest.approx(t.mean().item(), abs=1e-6)
        population = math.sqrt(((t - t.mean()) ** 2).mean().item())
        assert stats["std"] == pytest.approx(population, abs=1e-6)
        assert stats["std"] != pytest.approx(t.std().item(), abs=1e-9)  # not Bessel-corrected
        assert stats["zero_fraction"] == pytest.approx((t == 0).double().mean().item(), abs=1e-12)
    assert 0.2 < body["activations"]["relu#3"]["output"]["zero_fraction"] < 1.0
    assert body["activations"]["relu"]["output"]["min"] == 0.0
    assert len(body["predictions"]) == 2


@pytest.mark.parametrize("fmt", ["safetensors", "npz"])
def test_binary_formats(builtin_client: TestClient, lenet: nn.Module, fmt: str) -> None:
    x = torch.stack([digit_pixels(2), digit_pixels(5)])
    inputs = [tensor_input(t) for t in x]
    response = builtin_client.post(
        "/activations",
        json={"model": "lenet", "inputs": inputs, "layers": ["conv2", "relu"], "capture": "both", "format": fmt},
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/octet-stream"
    want = direct_capture(lenet, ["conv2", "relu"], x, "both")
    expected_keys = sorted(f"{k}:{s}" for k, sides in want.items() for s in sides)
    tensors, rest = read_binary_answer(response.content, fmt)
    assert sorted(tensors) == expected_keys
    for key, sides in want.items():
        for side, expected in sides.items():
            torch.testing.assert_close(tensors[f"{key}:{side}"], expected, rtol=0, atol=1e-6)
    predicted = builtin_client.post("/predict", json={"model": "lenet", "inputs": inputs, "top_k": 5}).json()
    assert rest["model"] == "lenet"
    assert_same_predictions(rest["predictions"], predicted["predictions"])
    assert rest["activations"]["conv2"] == {
        "input": {"shape": [2, 6, 14, 14], "dtype": "float32"},
        "output": {"shape": [2, 16, 10, 10], "dtype": "float32"},
    }


def test_format_png(builtin_client: TestClient, lenet: nn.Module) -> None:
    x = digit_pixels(3)[None]
    want = direct_capture(lenet, ["conv1", "conv2"], x)
    sizes = {}
    for layer, channels in (("conv1", 64), ("conv1", 2), ("conv2", 64), ("conv2", 4)):
        response = builtin_client.post(
            "/activations",
            json={
                "model": "lenet",
                "inputs": [tensor_input(x[0])],
                "layers": [layer],
                "format": "png",
                "channels": channels,
            },
        )
        assert response.status_code == 200, response.text
        assert response.headers["content-type"] == "image/png"
        image = np.asarray(Image.open(io.BytesIO(response.content)))
        expected = np.asarray(Image.open(io.BytesIO(feature_grid_png(want[layer]["output"][0], channels))))
        assert np.array_equal(image, expected)
        sizes[(layer, channels)] = image.shape[0] * image.shape[1]
    assert sizes[("conv1", 64)] > sizes[("conv1", 2)]  # 6 tiles against 2
    assert sizes[("conv2", 64)] > sizes[("conv2", 4)]  # 16 tiles against 4
    # png_layer picks one of several captured layers
    response = builtin_client.post(
        "/activations",
        json={
            "model": "lenet",
            "inputs": [tensor_input(x[0])],
            "layers": ["conv1", "conv2"],
            "format": "png",
            "png_layer": "conv2",
        },
    )
    assert response.status_code == 200
    expected = np.asarray(Image.open(io.BytesIO(feature_grid_png(want["conv2"]["output"][0], 64))))
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(response.content))), expected)


def test_multipart_form_like_curl(builtin_client: TestClient, lenet: nn.Module) -> None:
    files = [("image", ("digit.png", sample_png(7), "image/png")), ("image", ("b.png", sample_png(1), "image/png"))]
    response = builtin_client.post(
        "/activations", data={"model": "lenet", "layers": "conv1,conv2", "reduce": "mean"}, files=files
    )
    assert response.status_code == 200, response.text
    body = response.json()
    x = torch.stack([digit_pixels(7), digit_pixels(1)])
    want = direct_capture(lenet, ["conv1", "conv2"], x)
    assert list(body["activations"]) == ["conv1", "conv2"]
    for key in ("conv1", "conv2"):
        torch.testing.assert_close(
            as_tensor(body["activations"][key]["output"]), want[key]["output"].mean(dim=(2, 3)), rtol=0, atol=1e-6
        )
    assert [p["top_k"][0]["index"] for p in body["predictions"]] == [7, 1]


def test_json_answer_over_limit_is_413_with_advice(tmp_path: Path, make_client: ClientFactory) -> None:
    client = make_client(write_lenet(tmp_path), max_json_response_bytes=20_000)
    inputs = [tensor_input(digit_pixels(3))]
    response = client.post("/activations", json={"model": "lenet", "inputs": inputs, "layers": ["conv1"]})
    assert response.status_code == 413  # 4704 floats do not fit in 20 kB of JSON
    detail = response.json()["detail"]
    for advice in ("max_json_response_bytes", "stats", "reduce", "safetensors"):
        assert advice in detail
    assert_no_hooks(client, "lenet")
    for extra in ({"format": "stats"}, {"reduce": "mean"}, {"format": "safetensors"}):
        response = client.post("/activations", json={"model": "lenet", "inputs": inputs, "layers": ["conv1"]} | extra)
        assert response.status_code == 200, (extra, response.text)
    # the limit is checked on the whole answer: several small layers that add up are refused too
    response = client.post("/activations", json={"model": "lenet", "inputs": inputs * 4, "layers": ["conv2", "fc*"]})
    assert response.status_code == 413


def test_in_place_op_does_not_change_captured_output(builtin_client: TestClient, resnet: nn.Module) -> None:
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(4))
    body = post_activations(builtin_client, model="resnet18", inputs=[tensor_input(x[0])], layers=["layer1.0.bn1"])
    want = direct_capture(resnet, ["layer1.0.bn1"], x)["layer1.0.bn1"]["output"]
    assert (want < 0).any()  # the block's ReLU(inplace=True) would zero these
    got = as_tensor(body["activations"]["layer1.0.bn1"]["output"])
    assert (got < 0).sum() == (want < 0).sum()
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


# ---- failures leave no hooks -------------------------------------------------------------------


def test_forward_that_raises_leaves_no_hooks_and_no_traceback(tmp_path: Path) -> None:
    with toy_client(tmp_path) as client:
        ref = load_toy_module(tmp_path / "toy.py")
        huge = torch.full((4, 6, 6), 1e5)
        response = client.post(
            "/activations",
            json={"model": "toy", "inputs": [tensor_input(huge)], "layers": ["conv", "split", "*"], "capture": "both"},
        )
        assert response.status_code == 500
        assert response.json() == {"detail": "internal server error; the server log has the details"}
        assert "Traceback" not in response.text
        assert "boom" not in response.text
        assert_no_hooks(client, "toy")
        # the next request sees no hook left over from the failed one (one call per layer)
        x = torch.randn(1, 4, 6, 6, generator=torch.Generator().manual_seed(5))
        body = post_activations(client, model="toy", inputs=[tensor_input(x[0])], layers=["conv", "split"])
        assert sorted(body["activations"]) == ["conv", "split.0", "split.1"]
        assert_same(body["activations"], direct_capture(ref, ["conv", "split"], x))
        assert_no_hooks(client, "toy")


def test_client_failures_leave_no_hooks(builtin_client: TestClient) -> None:
    cases: list[tuple[dict[str, Any], int]] = [
        ({"model": "lenet", "inputs": [tensor_input(torch.zeros(3, 32, 32))], "layers": ["nope"]}, 422),
        ({"model": "lenet", "inputs": [{"image": "***not base64***"}], "layers": ["conv1"]}, 400),
        ({"model": "lenet", "inputs": [tensor_input(torch.zeros(3, 32, 32))], "layers": []}, 422),
        ({"model": "lenet", "inputs": [tensor_input(torch.zeros(3, 32, 32))], "layers": ["conv1"], "reduce": "x"}, 422),
        ({"model": "nope", "inputs": [tensor_input(torch.zeros(3, 32, 32))], "layers": ["conv1"]}, 404),
        # a sample size the model cannot run (fc1 expects 16*5*5 features): the client's mistake
        ({"model": "lenet", "inputs": [tensor_input(torch.zeros(3, 28, 28))], "layers": ["conv1", "relu"]}, 422),
    ]
    for body, status in cases:
        response = builtin_client.post("/activations", json=body)
        assert response.status_code == status, (body["layers"], response.text)
        assert "Traceback" not in response.text
        assert_no_hooks(builtin_client, "lenet")


def test_a_reentrant_module_numbers_its_calls_in_the_order_they_begin(make_client: ClientFactory) -> None:
    """`nest` calls itself twice over: the outermost call is `nest`, the innermost `nest#3`, although the
    innermost returns first (`tests.helpers.models.Reentrant`)."""
    client = make_client(toy_entry("reentrant", "Reentrant"))
    x = torch.tensor([1.0, 2.0, -3.0, 0.5])
    body = {"model": "reentrant", "inputs": [tensor_input(x)], "layers": ["nest"], "capture": "both"}
    r = client.post("/activations", json=body)
    assert r.status_code == 200, r.text
    got = {key: {side: as_tensor(t)[0] for side, t in sides.items()} for key, sides in r.json()["activations"].items()}
    assert got.keys() == {"nest", "nest#2", "nest#2.0", "nest#3", "nest#3.0"}  # inner calls also pass `depth`
    assert torch.equal(got["nest"]["input"], x)
    assert torch.equal(got["nest"]["output"], 8 * (x + 2))
    assert torch.equal(got["nest#2.0"]["input"], x + 1)
    assert torch.equal(got["nest#2"]["output"], 4 * (x + 2))
    assert torch.equal(got["nest#3.0"]["input"], x + 2)
    assert torch.equal(got["nest#3"]["output"], 2 * (x + 2))
    tensor = {"name": "input__0", "shape": [1, 4], "datatype": "FP32", "data": x.tolist()}
    v2 = client.post("/v2/models/reentrant/infer", json={"inputs": [tensor], "outputs": [{"name": "nest#2"}]})
    assert v2.status_code == 200, v2.text
    assert v2.json()["outputs"][0]["data"] == (4 * (x + 2)).tolist()
