"""POST /predict through the ASGI app: every input form, top-k semantics, labels, preprocessing parity."""

from __future__ import annotations

import io
import struct
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from PIL import Image
from skimage import data as skdata
from torchvision.models import ResNet
from torchvision.transforms import v2

from service.config import Settings
from service.main import create_app
from service.zoo.lenet import LeNet, load_lenet
from tests.conftest import b64, sample_png, tensor_input, wait_settled
from tests.helpers.reference_models import seeded_resnet18

PETS = ["cat", "dog", "emu"]
TINY_PY = """
import torch
from torch import nn


class Tiny(nn.Module):
    \"\"\"logits = W x + b on a [1, 2, 2] input, hand-set.\"\"\"

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        with torch.no_grad():
            self.fc.weight.copy_(torch.tensor([[1.0, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, -1]]))
            self.fc.bias.copy_(torch.tensor([0.0, 0.5, 0.0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))
"""
CONFIG = """
[[models]]
name = "tv"
source = "torchvision"
architecture = "resnet18"
weights = "resnet18_k7.pt"
kwargs = { num_classes = 7 }

[[models]]
name = "pets"
source = "python"
architecture = "tiny.py:Tiny"
input_size = [1, 2, 2]
labels = "pets.txt"

[[models]]
name = "unlabelled"
source = "python"
architecture = "tiny.py:Tiny"
input_size = [1, 2, 2]
"""
MODES = {"bilinear": v2.InterpolationMode.BILINEAR, "bicubic": v2.InterpolationMode.BICUBIC}


def tiny_logits(x: torch.Tensor) -> torch.Tensor:
    flat = x.flatten(1)
    return torch.stack([flat[:, 0], flat[:, 1] + 0.5, flat[:, 2] - flat[:, 3]], dim=1)


@pytest.fixture(scope="module")
def r18() -> ResNet:
    return seeded_resnet18(num_classes=7)


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory, r18: ResNet) -> Iterator[TestClient]:
    root = tmp_path_factory.mktemp("predict")
    torch.save(r18.state_dict(), root / "resnet18_k7.pt")
    (root / "tiny.py").write_text(TINY_PY)
    (root / "pets.txt").write_text("\n".join(PETS) + "\n")
    (root / "models.toml").write_text(CONFIG)
    settings = Settings(model_dir=root, config=root / "models.toml", device="cpu", worker_threads=2, torch_threads=1)
    with TestClient(create_app(settings)) as c:
        wait_settled(c)
        statuses = {m["name"]: m["status"] for m in c.get("/models").json()["models"]}
        assert statuses == {"tv": "ready", "pets": "ready", "unlabelled": "ready"}
        yield c


@pytest.fixture(scope="module")
def lenet() -> LeNet:
    return load_lenet()


def reference_pipeline(preprocess: dict[str, Any]) -> v2.Compose:
    """The torchvision pipeline a client writes from INFO `preprocess` (square crop after shorter-side resize)."""
    steps: list[v2.Transform] = [v2.Grayscale(num_output_channels=3)] if preprocess["grayscale"] else []
    steps += [
        v2.Resize(preprocess["resize"], interpolation=MODES[preprocess["interpolation"]], antialias=True),
        v2.CenterCrop(preprocess["crop"]),
        v2.ToImage(),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(preprocess["mean"], preprocess["std"]),
    ]
    return v2.Compose(steps)


def encode(image: Image.Image, fmt: str, **options: Any) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def decode(data: bytes) -> Image.Image:
    with Image.open(io.BytesIO(data)) as image:
        return image.convert("RGB") if image.mode not in ("RGB", "L") else image.copy()


def predict(client: TestClient, body: dict[str, Any]) -> list[dict[str, Any]]:
    response = client.post("/predict", json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["model"] == body["model"]
    predictions: list[dict[str, Any]] = answer["predictions"]
    assert len(predictions) == len(body["inputs"])
    return predictions


def lenet_input(builtin_client: TestClient, png: bytes) -> torch.Tensor:
    preprocess = builtin_client.get("/models/lenet").json()["preprocess"]
    tensor: torch.Tensor = reference_pipeline(preprocess)(decode(png))
    return tensor


# ---- image inputs -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fmt", "options"),
    [("PNG", {}), ("BMP", {}), ("WEBP", {"lossless": True}), ("WEBP", {"quality": 90}), ("JPEG", {"quality": 95})],
)
def test_base64_image_formats(builtin_client: TestClient, lenet: LeNet, fmt: str, options: dict[str, Any]) -> None:
    digit = Image.open(io.BytesIO(sample_png(7))).convert("L").resize((32, 32), Image.Resampling.BILINEAR)
    data = encode(digit if fmt != "WEBP" else digit.convert("RGB"), fmt, **options)
    (prediction,) = predict(
        builtin_client, {"model": "lenet", "inputs": [{"image": b64(data)}], "include_logits": True}
    )
    with torch.inference_mode():
        expected = lenet(lenet_input(builtin_client, data).unsqueeze(0))[0]
    torch.testing.assert_close(torch.tensor(prediction["logits"]), expected, rtol=0, atol=1e-4)
    assert prediction["top_k"][0]["index"] == int(expected.argmax())
    assert prediction["top_k"][0]["label"] == "7"


def test_resnet18_preprocessing_equals_torchvision_v2(client: TestClient, r18: ResNet) -> None:
    info = client.get("/models/tv").json()
    assert info["preprocess"] == {
        "resize": 256,
        "crop": 224,
        "interpolation": "bilinear",
        "mean": [0.485, 0.456, 0.406],
        "std": [0.229, 0.224, 0.225],
        "grayscale": False,
    }
    assert info["input_size"] == [3, 224, 224]
    chelsea = Image.fromarray(skdata.chelsea())
    files = [encode(chelsea, "PNG"), encode(chelsea, "JPEG", quality=90)]
    predictions = predict(
        client, {"model": "tv", "inputs": [{"image": b64(f)} for f in files], "include_logits": True, "top_k": 7}
    )
    transform = v2.Compose(
        [
            v2.Resize(256, antialias=True),
            v2.CenterCrop(224),
            v2.ToImage(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(info["preprocess"]["mean"], info["preprocess"]["std"]),
        ]
    )
    batch = torch.stack([transform(decode(f)) for f in files])
    with torch.inference_mode():
        expected = r18(batch)
    for prediction, row in zip(predictions, expected, strict=True):
        torch.testing.assert_close(torch.tensor(prediction["logits"]), row, rtol=0, atol=1e-4)
    assert not torch.allclose(expected[0], expected[1])  # the two codecs really gave different inputs


def test_image_of_any_size_is_resized_and_cropped(builtin_client: TestClient, lenet: LeNet) -> None:
    wide = Image.open(io.BytesIO(sample_png(4))).convert("L").resize((120, 45))
    data = encode(wide, "PNG")
    (prediction,) = predict(
        builtin_client, {"model": "lenet", "inputs": [{"image": b64(data)}], "include_logits": True}
    )
    with torch.inference_mode():
        expected = lenet(lenet_input(builtin_client, data).unsqueeze(0))[0]
    torch.testing.assert_close(torch.tensor(prediction["logits"]), expected, rtol=0, atol=1e-4)


# ---- tensor inputs ------------------------------------------------------------------------


def test_tensor_inputs_nested_flat_and_b64(builtin_client: TestClient, lenet: LeNet) -> None:
    x = lenet_input(builtin_client, sample_png(2))
    flat = {"tensor": {"shape": [3, 32, 32], "dtype": "float32", "data": x.flatten().tolist()}}
    half = {"tensor": {"shape": [3, 32, 32], "dtype": "float16", "b64": b64(x.half().numpy().tobytes())}}
    inputs = [tensor_input(x), flat, tensor_input(x, as_b64=True), half]
    predictions = predict(builtin_client, {"model": "lenet", "inputs": inputs, "include_logits": True})
    with torch.inference_mode():
        expected = lenet(x.unsqueeze(0))[0]
        expected_half = lenet(x.half().float().unsqueeze(0))[0]
    for prediction in predictions[:3]:
        torch.testing.assert_close(torch.tensor(prediction["logits"]), expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(torch.tensor(predictions[3]["logits"]), expected_half, rtol=0, atol=1e-5)
    assert not torch.equal(x.half().float(), x)  # float16 really lost precision: the paths differ
    assert all(p["top_k"][0]["label"] == "2" for p in predictions)


def test_other_spatial_sizes_are_fed_as_they_are(builtin_client: TestClient) -> None:
    torch.manual_seed(1)
    (prediction,) = predict(
        builtin_client, {"model": "resnet18", "inputs": [tensor_input(torch.randn(3, 64, 48))], "top_k": 2}
    )
    assert len(prediction["top_k"]) == 2
    assert "logits" not in prediction


def test_hand_set_model_gives_exact_logits(client: TestClient) -> None:
    xs = torch.tensor([[[[1.0, 2.0], [3.0, -1.0]]], [[[0.0, 0.0], [0.0, 0.0]]], [[[-2.0, -3.0], [4.0, 4.0]]]])
    predictions = predict(
        client, {"model": "pets", "inputs": [tensor_input(x) for x in xs], "include_logits": True, "top_k": 3}
    )
    expected = tiny_logits(xs)
    for prediction, logits in zip(predictions, expected, strict=True):
        assert prediction["logits"] == logits.tolist()
        probabilities = torch.softmax(logits, dim=0)
        order = torch.argsort(probabilities, descending=True, stable=True).tolist()
        assert [c["index"] for c in prediction["top_k"]] == order
        assert [c["label"] for c in prediction["top_k"]] == [PETS[i] for i in order]
        assert [c["score"] for c in prediction["top_k"]] == pytest.approx(probabilities[order].tolist(), abs=1e-7)


# ---- top-k and labels ----------------------------------------------------------------------


def test_top_k_semantics(builtin_client: TestClient) -> None:
    inputs = [{"image": b64(sample_png(5))}]
    default, three, everything = (
        predict(builtin_client, {"model": "lenet", "inputs": inputs, **extra})[0]
        for extra in ({"include_logits": True}, {"top_k": 3}, {"top_k": 1000})
    )
    assert set(default) == {"top_k", "logits"}
    assert set(three) == {"top_k"}
    assert len(default["top_k"]) == 5
    assert len(three["top_k"]) == 3
    assert len(everything["top_k"]) == 10  # clipped to the number of classes
    probabilities = torch.softmax(torch.tensor(default["logits"], dtype=torch.float32), dim=0)
    scores = [c["score"] for c in everything["top_k"]]
    assert scores == sorted(scores, reverse=True)
    assert sorted(c["index"] for c in everything["top_k"]) == list(range(10))
    for choice in everything["top_k"]:
        assert choice["score"] == pytest.approx(float(probabilities[choice["index"]]), abs=1e-6)
        assert 0.0 <= choice["score"] <= 1.0
    assert sum(scores) == pytest.approx(1.0, abs=1e-5)
    assert sum(c["score"] for c in three["top_k"]) <= 1.0 + 1e-6
    assert three["top_k"] == everything["top_k"][:3] == default["top_k"][:3]
    assert everything["top_k"][0]["label"] == "5"


def test_labels_are_index_strings_without_a_labels_file(client: TestClient) -> None:
    x = torch.tensor([[[1.0, 2.0], [3.0, -1.0]]])  # logits [1, 2.5, 4]: emu, dog, cat
    body = {"inputs": [tensor_input(x)], "top_k": 3}
    labelled = predict(client, {"model": "pets", **body})[0]["top_k"]
    plain = predict(client, {"model": "unlabelled", **body})[0]["top_k"]
    assert [(c["index"], c["label"]) for c in labelled] == [(2, "emu"), (1, "dog"), (0, "cat")]
    assert [(c["index"], c["label"]) for c in plain] == [(2, "2"), (1, "1"), (0, "0")]
    assert client.get("/models/pets").json()["labels"] is True
    assert client.get("/models/unlabelled").json()["labels"] is False


# ---- multipart ----------------------------------------------------------------------------


def test_multipart_like_curl(builtin_client: TestClient) -> None:
    digits = [0, 6, 9]
    files = [("image", (f"digit_{d}.png", sample_png(d), "image/png")) for d in digits]
    response = builtin_client.post(
        "/predict", data={"model": "lenet", "top_k": "2", "include_logits": "true"}, files=files
    )
    assert response.status_code == 200, response.text
    predictions = response.json()["predictions"]
    assert [p["top_k"][0]["label"] for p in predictions] == ["0", "6", "9"]
    assert all(len(p["top_k"]) == 2 and len(p["logits"]) == 10 for p in predictions)
    as_json = predict(
        builtin_client,
        {
            "model": "lenet",
            "inputs": [{"image": b64(sample_png(d))} for d in digits],
            "top_k": 2,
            "include_logits": True,
        },
    )
    assert predictions == as_json

    response = builtin_client.post("/predict", data={"model": "lenet", "include_logits": "false"}, files=files[:1])
    assert response.status_code == 200, response.text
    (only,) = response.json()["predictions"]
    assert set(only) == {"top_k"}
    assert len(only["top_k"]) == 5


def test_multipart_accepts_any_file_type_header(builtin_client: TestClient) -> None:
    files = [("image", ("blob", sample_png(1), "application/octet-stream"))]
    response = builtin_client.post("/predict", data={"model": "lenet", "top_k": "1"}, files=files)
    assert response.status_code == 200, response.text
    assert response.json()["predictions"][0]["top_k"][0]["label"] == "1"


# ---- concurrency --------------------------------------------------------------------------


def test_concurrent_requests_get_their_own_answers(builtin_client: TestClient) -> None:
    executor = builtin_client.app.state.hookserve.fleet.entry("lenet").executor  # type: ignore[attr-defined]
    before = (executor.stats.batches, executor.stats.batched_samples)
    digits = list(range(10)) * 2

    def one(d: int) -> str:
        response = builtin_client.post("/predict", json={"model": "lenet", "inputs": [{"image": b64(sample_png(d))}]})
        assert response.status_code == 200, response.text
        label: str = response.json()["predictions"][0]["top_k"][0]["label"]
        return label

    with ThreadPoolExecutor(max_workers=8) as pool:
        labels = list(pool.map(one, digits))
    assert labels == [str(d) for d in digits]
    batches = executor.stats.batches - before[0]
    assert executor.stats.batched_samples - before[1] == len(digits)
    assert 1 <= batches <= len(digits)


def test_chelsea_fixture_is_what_we_think(tmp_path: Path) -> None:
    """Guards the parity test: chelsea is a non-square RGB photo, so resize and crop both matter."""
    array = skdata.chelsea()
    assert array.shape == (300, 451, 3)
    assert array.dtype == np.uint8


def jpeg_declaring(width: int, height: int) -> bytes:
    """A 16x16 JPEG, EOI and all, whose frame header is patched to claim `width`x`height` (about 630 bytes)."""
    data = bytearray(encode(Image.new("RGB", (16, 16), (200, 10, 10)), "JPEG"))
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def truncated_images() -> dict[str, bytes]:
    digit = Image.open(io.BytesIO(sample_png(3))).convert("RGB").resize((256, 256))
    jpeg, png = encode(digit, "JPEG", quality=90), sample_png(3)
    progressive = encode(digit, "JPEG", progressive=True)
    return {
        "jpeg_half": jpeg[: len(jpeg) // 2],
        "jpeg_header_6000x6000": jpeg_declaring(6000, 6000),
        "progressive_jpeg_half": progressive[: len(progressive) // 2],
        "png_half": png[: len(png) // 2],
    }


@pytest.mark.parametrize("name", list(truncated_images()))
def test_truncated_images_are_400(builtin_client: TestClient, name: str) -> None:
    data = truncated_images()[name]
    response = builtin_client.post("/predict", json={"model": "lenet", "inputs": [{"image": b64(data)}]})
    assert response.status_code == 400, response.text
    assert "could not be decoded (truncated or corrupt)" in response.json()["detail"]
    files = {"image": ("x.jpg", data)}
    response = builtin_client.post("/predict", data={"model": "lenet"}, files=files)
    assert response.status_code == 400, response.text


@pytest.mark.parametrize(
    "options", [{"quality": q} for q in (1, 50, 95, 100)] + [{"progressive": True}, {"optimize": True}]
)
def test_whole_jpegs_still_predict(builtin_client: TestClient, options: dict[str, Any]) -> None:
    for image in (Image.open(io.BytesIO(sample_png(5))).convert("L"), Image.new("RGB", (640, 480))):
        data = encode(image, "JPEG", **options)
        (prediction,) = predict(builtin_client, {"model": "lenet", "inputs": [{"image": b64(data)}]})
        assert prediction["top_k"]
