"""The built-in LeNet and digits ViT classify the 360 held-out digits through POST /predict from PNGs (>= 0.95)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image
from sklearn.datasets import load_digits

from tests.conftest import b64

HELD_OUT = 360
BATCH = 64  # the default max_inputs


def digit_png(values: np.ndarray) -> bytes:
    """An 8×8 digit as the digits data draws it: bright ink on black, value × 16, as a grayscale PNG."""
    pixels = np.clip(values.reshape(8, 8) * 16, 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels, mode="L").save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def held_out() -> tuple[list[bytes], list[int]]:
    digits = load_digits()
    images = [digit_png(row) for row in digits.data[-HELD_OUT:]]
    targets = [int(t) for t in digits.target[-HELD_OUT:]]
    return images, targets


def top1(answer: dict[str, object]) -> list[int]:
    predictions = answer["predictions"]
    assert isinstance(predictions, list)
    return [int(p["top_k"][0]["label"]) for p in predictions]


@pytest.mark.parametrize("model", ["lenet", "vit_digits"])
def test_held_out_accuracy_through_predict(
    builtin_client: TestClient, held_out: tuple[list[bytes], list[int]], model: str
) -> None:
    images, targets = held_out
    assert len(images) == HELD_OUT
    predicted: list[int] = []
    for start in range(0, HELD_OUT, BATCH):
        chunk = images[start : start + BATCH]
        if start == BATCH:  # one request the way curl sends it
            files = [("image", (f"{start + i}.png", data, "image/png")) for i, data in enumerate(chunk)]
            response = builtin_client.post("/predict", data={"model": model, "top_k": "1"}, files=files)
        else:
            body = {"model": model, "inputs": [{"image": b64(data)} for data in chunk], "top_k": 1}
            response = builtin_client.post("/predict", json=body)
        assert response.status_code == 200, response.text
        labels = top1(response.json())
        assert len(labels) == len(chunk)
        predicted += labels
    accuracy = float(np.mean(np.array(predicted) == np.array(targets)))
    assert accuracy >= 0.95, f"held-out accuracy {accuracy:.3f}"
    assert len(set(predicted)) == 10  # every class is predicted: not a constant answer
