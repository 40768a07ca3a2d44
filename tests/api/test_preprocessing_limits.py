"""Images whose preprocessing would make huge images are refused from their header, before decoding.

A 1 x 100000 PNG is only 100,000 pixels (under max_image_pixels), but resizing its shorter side
to the model's size makes it that many times taller: the size of every preprocessing step is
computed from the header and bounded by `max_preprocessed_pixels`.
"""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path

import httpx2
import pytest
from fastapi.testclient import TestClient
from PIL import Image, ImageFile

from tests.conftest import ClientFactory, sample_png, write_lenet


def encoded(size: tuple[int, int], fmt: str) -> bytes:
    buffer = io.BytesIO()
    Image.new("L", size).save(buffer, format=fmt)
    return buffer.getvalue()


def predict(client: TestClient, data: bytes, name: str = "x.png") -> httpx2.Response:
    return client.post("/predict", data={"model": "lenet"}, files={"image": (name, data)})


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every image PIL decodes from here on."""
    decoded: list[object] = []
    original_load = ImageFile.ImageFile.load

    def spy(self: ImageFile.ImageFile) -> object:
        decoded.append(self)
        return original_load(self)

    monkeypatch.setattr(ImageFile.ImageFile, "load", spy)
    return decoded


def test_a_thin_png_is_refused_from_its_header_at_the_default_limit(
    make_client: ClientFactory, tmp_path: Path, decodes: list[object]
) -> None:
    """The reported attack: a few hundred bytes of PNG whose resize would be 32 x 3,200,000 for the LeNet (and
    256 x 25,600,000 for resnet18)."""
    client = make_client(write_lenet(tmp_path))
    png = encoded((1, 100000), "PNG")
    assert len(png) < 1000
    response = predict(client, png)
    assert response.status_code == 413, response.text
    detail = response.json()["detail"]
    assert "image[0] is 1x100000" in detail
    assert "32x3200000" in detail  # the step and the size it would make
    assert "max_preprocessed_pixels" in detail
    assert "nearer to square" in detail  # the way out
    assert decodes == []  # refused before a pixel was decoded
    normal = predict(client, sample_png(3))  # the server is alive and a normal image passes
    assert normal.status_code == 200, normal.text
    assert normal.json()["predictions"][0]["top_k"][0]["label"] == "3"


@pytest.mark.parametrize(
    ("fmt", "size"),
    [("PNG", (40000, 1)), ("JPEG", (1, 20000)), ("WEBP", (16000, 1))],  # WebP's sides stop at 16383
)
def test_thin_images_of_every_format_are_refused_over_the_setting(
    make_client: ClientFactory, tmp_path: Path, decodes: list[object], fmt: str, size: tuple[int, int]
) -> None:
    client = make_client(write_lenet(tmp_path), max_preprocessed_pixels=100_000)
    response = predict(client, encoded(size, fmt), f"x.{fmt.lower()}")
    assert response.status_code == 413, response.text
    detail = response.json()["detail"]
    assert "resizing its shorter side to 32" in detail
    assert "over the limit of 100000 (max_preprocessed_pixels)" in detail
    assert "sides at most 97:1" in detail  # 100000 // 32**2
    assert decodes == []
    near = predict(client, encoded((32 * 90, 32), fmt), f"y.{fmt.lower()}")  # 90:1 passes
    assert near.status_code == 200, near.text


def test_the_same_bound_holds_for_the_v2_protocol_images(make_client: ClientFactory, tmp_path: Path) -> None:
    """Open Inference Protocol BYTES inputs are images preprocessed like /predict's: bounded alike."""
    client = make_client(write_lenet(tmp_path), max_preprocessed_pixels=100_000)
    png = encoded((1, 5000), "PNG")
    element = struct.pack("<I", len(png)) + png  # a BYTES element: its length, then its bytes
    tensor = {"name": "input__0", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": len(element)}}
    header = json.dumps({"inputs": [tensor]}).encode()
    response = client.post(
        "/v2/models/lenet/infer",
        content=header + element,
        headers={"Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"},
    )
    assert response.status_code == 413, response.text
    assert "max_preprocessed_pixels" in response.json()["error"]
