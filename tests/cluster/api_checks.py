"""The API calls that matter, made against a cluster and against one in-process app, answers compared.

Both layouts run these: predict (multipart and JSON), activations, saliency, and /v2
through `tritonclient.http`. The reference is `create_app` over the same models TOML in the
test process, with one thread per job as in each replica, so numbers agree to float noise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import numpy as np
import tritonclient.http as triton
from fastapi.testclient import TestClient

from service.cluster.messages import REPLICA_HEADER
from service.config import Settings
from service.main import create_app
from tests.conftest import sample_png, wait_settled

RTOL = ATOL = 1e-5


def reference_client(model_dir: Path, config: Path) -> TestClient:
    """The single-process app over the same TOML (entered: the caller exits it)."""
    settings = Settings(model_dir=model_dir, config=config, worker_threads=1, cpu_threads=1, torch_threads=1)
    client = TestClient(create_app(settings))
    client.__enter__()
    wait_settled(client)
    return client


def digits(n: int, seed: int) -> np.ndarray[Any, Any]:
    return np.random.default_rng(seed).standard_normal((n, 3, 32, 32)).astype(np.float32)


def tensor_body(model: str, x: np.ndarray[Any, Any], **extra: Any) -> dict[str, Any]:
    inputs = [{"tensor": {"shape": list(row.shape), "dtype": "float32", "data": row.tolist()}} for row in x]
    return {"model": model, "inputs": inputs, **extra}


def replica_of(response: httpx.Response) -> str:
    """The `X-Hookserve-Replica` header: `<deployment>#<replica id>`."""
    value: str | None = response.headers.get(REPLICA_HEADER)
    assert value, f"no {REPLICA_HEADER} header on {response.request.url}: {dict(response.headers)}"
    return value


def check_predict(url: str, ref: TestClient, model: str, deployment: str) -> None:
    image = sample_png(7)
    form = {"model": model, "top_k": "3"}
    got = httpx.post(f"{url}/predict", data=form, files={"image": ("d.png", image, "image/png")}, timeout=60)
    assert got.status_code == 200, got.text
    assert replica_of(got).startswith(f"{deployment}#")
    assert got.json()["predictions"][0]["top_k"][0]["label"] == "7"
    body = tensor_body(model, digits(2, seed=1), include_logits=True, top_k=3)
    got = httpx.post(f"{url}/predict", json=body, timeout=60)
    want = ref.post("/predict", json=body)
    assert got.status_code == want.status_code == 200, got.text
    assert replica_of(got).startswith(f"{deployment}#")
    for g, w in zip(got.json()["predictions"], want.json()["predictions"], strict=True):
        np.testing.assert_allclose(g["logits"], w["logits"], rtol=RTOL, atol=ATOL)
        assert [t["index"] for t in g["top_k"]] == [t["index"] for t in w["top_k"]]


def check_activations(url: str, ref: TestClient, model: str, deployment: str) -> None:
    body = tensor_body(model, digits(1, seed=2), layers=["conv1", "fc*"], capture="both")
    got = httpx.post(f"{url}/activations", json=body, timeout=60)
    want = ref.post("/activations", json=body).json()
    assert got.status_code == 200, got.text
    assert replica_of(got).startswith(f"{deployment}#")
    answer = got.json()
    assert answer["activations"].keys() == want["activations"].keys()
    for layer, sides in want["activations"].items():
        for side, tensor in sides.items():
            mine = answer["activations"][layer][side]
            assert mine["shape"] == tensor["shape"]
            np.testing.assert_allclose(mine["data"], tensor["data"], rtol=RTOL, atol=ATOL)
    info = httpx.get(f"{url}/models/{model}", timeout=60).json()
    assert info["hooks"] == 0


def check_saliency(url: str, ref: TestClient, model: str, deployment: str) -> None:
    form = {"model": model, "method": "integrated_gradients", "steps": "16", "target": "7"}
    files = {"image": ("d.png", sample_png(7), "image/png")}
    got = httpx.post(f"{url}/saliency", data=form, files=files, timeout=120)
    want = ref.post("/saliency", data=form, files=files).json()
    assert got.status_code == 200, got.text
    assert replica_of(got).startswith(f"{deployment}#")
    mine, theirs = got.json()["results"][0], want["results"][0]
    assert mine["target"] == theirs["target"] == 7
    np.testing.assert_allclose(mine["attribution"]["data"], theirs["attribution"]["data"], rtol=RTOL, atol=ATOL)
    gradcam = {"model": model, "method": "gradcam", "target": "7", "format": "png"}  # steps is IG's own
    png = httpx.post(f"{url}/saliency", data=gradcam, files=files, timeout=60)
    assert png.status_code == 200, png.text
    assert png.content.startswith(b"\x89PNG")


def check_v2(port: int, ref: TestClient, model: str) -> None:
    """tritonclient, binary tensors in and out, the classification extension and a layer output."""
    client = triton.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=120)
    try:
        assert client.is_server_live()
        assert client.is_server_ready()
        assert client.is_model_ready(model)
        assert client.get_model_metadata(model)["inputs"][0]["name"] == "input__0"
        x = digits(2, seed=3)
        tensor = triton.InferInput("input__0", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        outputs = [triton.InferRequestedOutput("output__0"), triton.InferRequestedOutput("fc2")]
        result = client.infer(model, [tensor], outputs=outputs)
        logits = result.as_numpy("output__0")
        body = tensor_body(model, x, include_logits=True)
        want = ref.post("/predict", json=body).json()["predictions"]
        np.testing.assert_allclose(logits, [p["logits"] for p in want], rtol=RTOL, atol=ATOL)
        assert result.as_numpy("fc2").shape == (2, 84)
        classes = client.infer(model, [tensor], outputs=[triton.InferRequestedOutput("output__0", class_count=2)])
        top = [row[0].decode().split(":")[1] for row in classes.as_numpy("output__0")]
        assert top == [str(int(np.argmax(row))) for row in logits]
    finally:
        client.close()
