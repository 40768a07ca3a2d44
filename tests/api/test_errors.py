"""Every client mistake on /predict gets its status (400/404/409/413/422) and a `{"detail": ...}` body.

No answer is a 500, none carries a traceback or a server path.
"""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from PIL import Image

import service
from tests.conftest import ClientFactory, b64, sample_png, tensor_input

TINY_CONFIG = """
[[models]]
name = "tiny"
source = "python"
architecture = "service.zoo.lenet:LeNet"
input_size = [3, 32, 32]

[[models]]
name = "broken"
source = "python"
architecture = "service.zoo.lenet:NoSuchClass"
"""
PACKAGE_DIR = str(Path(service.__file__).resolve().parent)
GOOD = {"tensor": {"shape": [3, 32, 32], "dtype": "float32", "data": [0.0] * 3072}}


def bomb_png(width: int = 30000, height: int = 30000) -> bytes:
    """A real 4×4 PNG whose IHDR claims `width`×`height`, CRC fixed: a decompression bomb."""
    buffer = io.BytesIO()
    Image.new("RGB", (4, 4)).save(buffer, format="PNG")
    data = bytearray(buffer.getvalue())
    data[16:24] = struct.pack(">II", width, height)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    return bytes(data)


def assert_error(response: Any, status: int, needle: str, *, model_dir: Path | None = None) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"detail"}
    text = response.text
    assert needle in text, text
    assert "Traceback" not in text
    assert 'File "' not in text
    assert PACKAGE_DIR not in text
    if model_dir is not None:
        assert str(model_dir) not in text


def tensor(shape: list[int], **fields: Any) -> dict[str, Any]:
    numel = 1
    for s in shape:
        numel *= s
    return {"tensor": {"shape": shape, "dtype": "float32", "data": [0.0] * numel, **fields}}


def multipart_without_files(fields: dict[str, str]) -> tuple[bytes, dict[str, str]]:
    """A multipart/form-data body with text fields only (httpx would send urlencoded)."""
    boundary = "hookserve-test-boundary"
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n' for k, v in fields.items()]
    body = ("".join(parts) + f"--{boundary}--\r\n").encode()
    return body, {"content-type": f"multipart/form-data; boundary={boundary}"}


# ---- 400: undecodable ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("inputs", "needle"),
    [
        ([{"image": "not base64 at all!"}], "inputs[0].image is not valid base64"),
        ([GOOD, {"image": b64(b"GIF87a-but-not-really")}], "inputs[1].image is not a decodable image"),
        ([{"image": b64(sample_png(3)[:40])}], "inputs[0].image"),
        ([{"tensor": {"shape": [3, 32, 32], "b64": "@@@@"}}], "inputs[0].tensor.b64 is not valid base64"),
    ],
)
def test_undecodable_inputs_are_400(builtin_client: TestClient, inputs: list[Any], needle: str) -> None:
    assert_error(builtin_client.post("/predict", json={"model": "lenet", "inputs": inputs}), 400, needle)


@pytest.mark.parametrize("raw", [b'{"model": "lenet", ', b"model=lenet", b"\xff\xfe", b"[1, 2"])
def test_invalid_json_is_400(builtin_client: TestClient, raw: bytes) -> None:
    response = builtin_client.post("/predict", content=raw, headers={"content-type": "application/json"})
    assert_error(response, 400, "body is not valid JSON")


def test_multipart_file_that_is_not_an_image_is_400(builtin_client: TestClient) -> None:
    files = [("image", ("a.png", sample_png(1), "image/png")), ("image", ("b.png", b"plain text", "image/png"))]
    assert_error(
        builtin_client.post("/predict", data={"model": "lenet"}, files=files), 400, "image[1] is not a decodable"
    )


def test_malformed_multipart_is_400(builtin_client: TestClient) -> None:
    response = builtin_client.post("/predict", content=b"abc", headers={"content-type": "multipart/form-data"})
    assert_error(response, 400, "malformed multipart form")


# ---- 404 / 409 ----------------------------------------------------------------------------


def test_unknown_model_is_404(builtin_client: TestClient) -> None:
    assert_error(
        builtin_client.post("/predict", json={"model": "nope", "inputs": [GOOD]}), 404, "no model named 'nope'"
    )
    files = [("image", ("a.png", sample_png(1), "image/png"))]
    response = builtin_client.post("/predict", data={"model": "nope"}, files=files)
    assert_error(response, 404, "no model named 'nope'")


def test_failed_model_is_409_with_its_error(tmp_path: Path, make_client: ClientFactory) -> None:
    client = make_client(TINY_CONFIG)
    response = client.post("/predict", json={"model": "broken", "inputs": [GOOD]})
    assert_error(response, 409, "model 'broken' is failed", model_dir=tmp_path)
    assert "is not an nn.Module class" in response.json()["detail"]
    assert client.post("/predict", json={"model": "tiny", "inputs": [GOOD]}).status_code == 200


# ---- 413: limits --------------------------------------------------------------------------


def test_body_over_max_body_bytes_is_413(tmp_path: Path, make_client: ClientFactory) -> None:
    client = make_client(TINY_CONFIG, max_body_bytes=4096)
    small = {"model": "tiny", "inputs": [tensor([3, 32, 32], data=None, b64=b64(bytes(3 * 32 * 32 * 4)))]}
    response = client.post("/predict", json=small)
    assert_error(response, 413, "max_body_bytes", model_dir=tmp_path)  # 16 KiB of float32 in base64
    assert "4096-byte limit" in response.json()["detail"]
    tiny = {"model": "tiny", "inputs": [{"image": b64(sample_png(0))}]}
    assert client.post("/predict", json=tiny).status_code == 200
    chunks = iter([b'{"model": "tiny", "inputs": [', b" " * 4096, b"]}"])  # no Content-Length: counted as it streams
    assert_error(client.post("/predict", content=chunks), 413, "max_body_bytes")
    files = [("image", ("big.png", b"x" * 5000, "image/png"))]
    assert_error(client.post("/predict", data={"model": "tiny"}, files=files), 413, "max_body_bytes")


def test_decompression_bomb_is_413(builtin_client: TestClient) -> None:
    with Image.open(io.BytesIO(bomb_png())) as image:
        assert image.size == (30000, 30000)  # the header really claims 900 megapixels
    response = builtin_client.post("/predict", json={"model": "lenet", "inputs": [{"image": b64(bomb_png())}]})
    assert_error(response, 413, "max_image_pixels")
    assert "30000x30000" in response.json()["detail"]
    files = [("image", ("bomb.png", bomb_png(), "image/png"))]
    assert_error(builtin_client.post("/predict", data={"model": "lenet"}, files=files), 413, "max_image_pixels")


def test_more_inputs_than_max_inputs_is_413(builtin_client: TestClient) -> None:
    inputs = [{"tensor": {"shape": [1], "data": [0.0]}}] * 65
    response = builtin_client.post("/predict", json={"model": "lenet", "inputs": inputs})
    assert_error(response, 413, "65 inputs, over the limit of 64 per request (max_inputs)")


@pytest.mark.parametrize("count", [3, 6])
def test_more_images_than_max_inputs_is_413(make_client: ClientFactory, count: int) -> None:
    client = make_client(TINY_CONFIG, max_inputs=2)
    files = [("image", (f"{i}.png", sample_png(i), "image/png")) for i in range(count)]
    assert_error(client.post("/predict", data={"model": "tiny"}, files=files), 413, "max_inputs")


# ---- 422: invalid fields ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"model": "lenet", "inputs": [tensor([1, 32, 32])]}, "has 1 channels; lenet needs 3"),
        ({"model": "lenet", "inputs": [tensor([32, 32])]}, "takes one sample of rank 3"),
        ({"model": "lenet", "inputs": [tensor([1, 3, 32, 32])]}, "(no batch dimension)"),
        ({"model": "lenet", "inputs": [tensor([3, 8, 8])]}, "cannot run on samples of shape [3, 8, 8]"),
        ({"model": "lenet", "inputs": [tensor([3, 32, 32], data=[0.0] * 100)]}, "has 100 values; shape [3, 32, 32]"),
        ({"model": "lenet", "inputs": [tensor([3, 32, 32], b64=b64(bytes(10)), data=None)]}, "holds 10 bytes"),
        ({"model": "lenet", "inputs": [tensor([3, 32, 32], dtype="complex64")]}, "'complex64' is not one of"),
        ({"model": "lenet", "inputs": [tensor([3, 32, 32], data=[[0.0] * 32] * 96)]}, "nested as [96, 32]"),
        ({"model": "lenet", "inputs": [tensor([3, 32, 32], data=[1e39] * 3072)]}, "out of range for float32"),
        ({"model": "lenet", "inputs": [tensor([3, 32, 32], dtype="float64", data=[1e300] * 3072)]}, "NaN or infinite"),
        ({"model": "lenet", "inputs": [GOOD, tensor([3, 30, 30])]}, "inputs have different shapes"),
        ({"model": "lenet", "inputs": [{"tensor": {"shape": [3, 32, 32]}}]}, "exactly one of 'data' or 'b64'"),
        ({"model": "lenet", "inputs": [{}]}, "exactly one of 'image' or 'tensor'"),
        ({"model": "lenet", "inputs": [{"image": b64(sample_png(1)), **GOOD}]}, "exactly one of 'image' or 'tensor'"),
        ({"model": "lenet", "inputs": []}, "inputs"),
        ({"model": "lenet"}, "inputs"),
        ({"inputs": [GOOD]}, "model"),
        ({"model": "lenet", "inputs": [GOOD], "top_k": 0}, "top_k"),
        ({"model": "lenet", "inputs": [GOOD], "top_k": -3}, "top_k"),
        ({"model": "lenet", "inputs": [GOOD], "top_k": 1001}, "top_k"),
        ({"model": "lenet", "inputs": [GOOD], "top_k": "many"}, "top_k"),
        ({"model": "lenet", "inputs": [GOOD], "include_logits": "perhaps"}, "include_logits"),
        ({"model": "lenet", "inputs": [GOOD], "layers": ["conv1"]}, "layers"),
        ({"model": "lenet", "inputs": "not a list"}, "inputs"),
        ([1, 2, 3], "valid dictionary"),
    ],
)
def test_invalid_fields_are_422(builtin_client: TestClient, body: Any, needle: str) -> None:
    assert_error(builtin_client.post("/predict", json=body), 422, needle)


def test_nan_in_a_b64_tensor_is_422(builtin_client: TestClient) -> None:
    x = torch.zeros(3, 32, 32)
    x[1, 2, 3] = float("nan")
    assert_error(
        builtin_client.post("/predict", json={"model": "lenet", "inputs": [tensor_input(x, as_b64=True)]}),
        422,
        "NaN or infinite",
    )


def test_features_only_model_is_422_not_class_scores(builtin_client: TestClient) -> None:
    x = torch.zeros(3, 64, 64)
    response = builtin_client.post("/predict", json={"model": "efficientvit_b0", "inputs": [tensor_input(x)]})
    assert_error(response, 422, "not [N, K] class scores")
    assert "list of 4 tensors" in response.json()["detail"]


def test_empty_body_is_422(builtin_client: TestClient) -> None:
    response = builtin_client.post("/predict", content=b"", headers={"content-type": "application/json"})
    assert_error(response, 422, "empty body")


@pytest.mark.parametrize(
    ("fields", "files", "needle"),
    [
        ({}, [("image", ("a.png", sample_png(1), "image/png"))], "model"),
        ({"model": "lenet", "top_k": "0"}, [("image", ("a.png", sample_png(1), "image/png"))], "top_k"),
        (
            {"model": "lenet", "include_logits": "maybe"},
            [("image", ("a.png", sample_png(1), "image/png"))],
            "include_logits",
        ),
        ({"model": "lenet"}, [("file", ("a.png", sample_png(1), "image/png"))], "files go in 'image'"),
    ],
)
def test_invalid_multipart_fields_are_422(
    builtin_client: TestClient, fields: dict[str, str], files: list[Any], needle: str
) -> None:
    assert_error(builtin_client.post("/predict", data=fields, files=files), 422, needle)


def test_multipart_without_image_is_422(builtin_client: TestClient) -> None:
    body, headers = multipart_without_files({"model": "lenet", "top_k": "2"})
    assert_error(builtin_client.post("/predict", content=body, headers=headers), 422, "at least one 'image' file")


def test_multipart_duplicate_field_is_422(builtin_client: TestClient) -> None:
    files = [("image", ("a.png", sample_png(1), "image/png"))]
    response = builtin_client.post("/predict", data={"model": ["lenet", "resnet18"]}, files=files)
    assert_error(response, 422, "form field 'model' given twice")


def test_errors_leave_no_announced_requests_behind(builtin_client: TestClient) -> None:
    """Requests that fail while decoding must withdraw their announcement, or batches would wait for them."""
    for inputs in ([{"image": "###"}], [tensor([1, 32, 32])], [{"image": b64(bomb_png())}]):
        assert builtin_client.post("/predict", json={"model": "lenet", "inputs": inputs}).status_code >= 400
    executor = builtin_client.app.state.hookserve.fleet.entry("lenet").executor  # type: ignore[attr-defined]
    assert executor._scheduler.quiet  # nothing queued, nothing announced
    assert builtin_client.get("/models/lenet").json()["hooks"] == 0


def test_a_request_over_max_request_memory_bytes_is_413_naming_its_cost_and_the_setting(
    make_client: ClientFactory,
) -> None:
    client = make_client(TINY_CONFIG, max_request_memory_bytes=4096)
    body = {"model": "tiny", "inputs": [tensor_input(torch.zeros(3, 32, 32))] * 8, "layers": ["*"]}
    response = client.post("/activations", json=body)
    assert response.status_code == 413, response.text
    detail = response.json()["detail"]
    assert detail.startswith("this request would hold ")
    assert "of memory, over the " in detail
    assert " limit (max_request_memory_bytes); ask for fewer layers" in detail
    assert "over the 4.0 KiB limit" in detail  # a small limit in readable units, never "0.0 MiB"
