"""/v2 (Open Inference Protocol) against a live uvicorn on loopback, driven by `tritonclient.http` itself."""

from __future__ import annotations

import gzip
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
import tritonclient.http as triton
from fastapi import FastAPI
from fastapi.testclient import TestClient
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

import service.dataplane.oip as oip_plane
from service.config import Settings
from service.main import create_app
from service.registry.builtin import ZOO_DIR
from service.zoo.lenet import LeNet, load_lenet, samples_dir
from tests.helpers.waiting import wait_until

ADMIN = "s3cret"
AUTH = {"Authorization": f"Bearer {ADMIN}"}
MAX_INPUTS = 6
LENET_ONLY = """
[[models]]
name = "lenet"
source = "python"
architecture = "service.zoo.lenet:LeNet"
weights = "weights/lenet_digits.pt"
labels = "digits_labels.txt"
input_size = [3, 32, 32]
"""


def sample_png(label: int) -> bytes:
    return (samples_dir() / f"digit_{label}.png").read_bytes()


def make_app(settings: Settings) -> FastAPI:
    return create_app(settings)


@dataclass
class Live:
    url: str  # host:port, as tritonclient wants it
    client: triton.InferenceServerClient


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """uvicorn in a thread over the built-in registry; torn down with should_exit."""
    import uvicorn

    settings = Settings(
        model_dir=tmp_path_factory.mktemp("models"),
        worker_threads=2,
        torch_threads=1,
        admin_token=ADMIN,
        max_inputs=MAX_INPUTS,
    )
    server = uvicorn.Server(uvicorn.Config(make_app(settings), host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive(), "uvicorn stopped"
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    url = f"127.0.0.1:{port}"
    client = triton.InferenceServerClient(url, network_timeout=120)
    deadline = time.monotonic() + 120
    while not client.is_server_ready():
        assert time.monotonic() < deadline, "models did not load"
        time.sleep(0.05)
    yield Live(url, client)
    client.close()
    server.should_exit = True
    thread.join(60)


@pytest.fixture(scope="module")
def lenet() -> LeNet:
    return load_lenet()


def digits(n: int, seed: int = 0) -> np.ndarray[Any, Any]:
    return np.random.default_rng(seed).standard_normal((n, 3, 32, 32)).astype(np.float32)


def infer_input(x: np.ndarray[Any, Any], binary: bool = True, name: str = "input__0") -> triton.InferInput:
    tensor = triton.InferInput(name, list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    return tensor


def error_of(call: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call()
    return info.value


# ---- health and metadata -----------------------------------------------------------------


def test_health_and_server_metadata(live: Live) -> None:
    assert live.client.is_server_live()
    assert live.client.is_server_ready()
    assert live.client.get_server_metadata() == {
        "name": "hookserve",
        "version": "0.1.0",
        "extensions": ["binary_tensor_data", "classification", "model_repository", "model_configuration", "statistics"],
    }


def test_model_metadata(live: Live) -> None:
    expected = {
        "name": "lenet",
        "versions": ["1"],
        "platform": "pytorch",
        "inputs": [{"name": "input__0", "datatype": "FP32", "shape": [-1, 3, 32, 32]}],
        "outputs": [{"name": "output__0", "datatype": "FP32", "shape": [-1, 10]}],
    }
    assert live.client.get_model_metadata("lenet") == expected
    assert live.client.get_model_metadata("lenet", "1") == expected
    features = live.client.get_model_metadata("efficientvit_b0")["outputs"]
    assert [(o["name"], o["shape"]) for o in features] == [
        ("output__0", [-1, 16, 56, 56]),
        ("output__1", [-1, 32, 28, 28]),
        ("output__2", [-1, 64, 14, 14]),
        ("output__3", [-1, 128, 7, 7]),
    ]
    err = error_of(lambda: live.client.get_model_metadata("lenet", "2"))
    assert err.status() == "404"
    assert "no version '2'" in err.message()


def test_model_ready(live: Live) -> None:
    assert live.client.is_model_ready("lenet")
    assert live.client.is_model_ready("lenet", "1")
    assert not live.client.is_model_ready("lenet", "7")
    assert not live.client.is_model_ready("nope")


# ---- inference ---------------------------------------------------------------------------


def test_infer_binary_matches_torch_and_predict(live: Live, lenet: LeNet) -> None:
    x = digits(3)
    result = live.client.infer("lenet", [infer_input(x)])
    logits = result.as_numpy("output__0")
    assert logits.shape == (3, 10)
    assert logits.dtype == np.float32
    assert result.get_output("output__0")["parameters"]["binary_data_size"] == 3 * 10 * 4
    with torch.no_grad():
        expected = lenet(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)
    tensor = {"shape": [3, 32, 32], "dtype": "float32", "data": x[0].tolist()}
    body = {"model": "lenet", "inputs": [{"tensor": tensor}], "include_logits": True}
    predicted = httpx.post(f"http://{live.url}/predict", json=body, timeout=60).json()
    np.testing.assert_allclose(predicted["predictions"][0]["logits"], logits[0], rtol=1e-5, atol=1e-5)


def test_infer_json_in_json_out(live: Live, lenet: LeNet) -> None:
    x = digits(2, seed=1)
    outputs = [triton.InferRequestedOutput("output__0", binary_data=False)]
    result = live.client.infer("lenet", [infer_input(x, binary=False)], outputs=outputs, request_id="r-7")
    response = result.get_response()
    assert response["id"] == "r-7"
    assert response["model_name"] == "lenet"
    assert response["model_version"] == "1"
    assert "parameters" not in response["outputs"][0]
    assert len(response["outputs"][0]["data"]) == 20
    with torch.no_grad():
        expected = lenet(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(result.as_numpy("output__0"), expected, rtol=1e-5, atol=1e-5)


def test_classification_strings(live: Live) -> None:
    x = digits(2, seed=2)
    outputs = [triton.InferRequestedOutput("output__0", class_count=3)]
    classes = live.client.infer("lenet", [infer_input(x)], outputs=outputs).as_numpy("output__0")
    logits = live.client.infer("lenet", [infer_input(x)]).as_numpy("output__0")
    assert classes.shape == (2, 3)
    for row, scores in zip(classes, logits, strict=True):
        top = np.argsort(-scores, kind="stable")[:3]
        assert [c.decode() for c in row] == [f"{float(scores[i]):f}:{i}:{i}" for i in top]
    json_classes = live.client.infer(
        "lenet", [infer_input(x)], outputs=[triton.InferRequestedOutput("output__0", binary_data=False, class_count=2)]
    )
    assert json_classes.get_output("output__0")["data"] == [c.decode() for c in classes[:, :2].reshape(-1)]


def test_layer_outputs(live: Live, lenet: LeNet) -> None:
    x = digits(2, seed=3)
    outputs = [
        triton.InferRequestedOutput("conv1"),
        triton.InferRequestedOutput("relu#2", binary_data=False),
        triton.InferRequestedOutput("output__0"),
    ]
    result = live.client.infer("lenet", [infer_input(x)], outputs=outputs)
    with torch.no_grad():
        t = torch.from_numpy(x)
        conv1 = lenet.conv1(t)
        relu2 = torch.relu(lenet.conv2(lenet.pool(torch.relu(conv1))))
        logits = lenet(t)
    np.testing.assert_allclose(result.as_numpy("conv1"), conv1.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(result.as_numpy("relu#2"), relu2.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(result.as_numpy("output__0"), logits.numpy(), rtol=1e-5, atol=1e-5)
    assert [o["name"] for o in result.get_response()["outputs"]] == ["conv1", "relu#2", "output__0"]
    assert httpx.get(f"http://{live.url}/models/lenet", timeout=30).json()["hooks"] == 0


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_request(live: Live, algorithm: str) -> None:
    x = digits(1, seed=4)
    plain = live.client.infer("lenet", [infer_input(x)]).as_numpy("output__0")
    packed = live.client.infer("lenet", [infer_input(x)], request_compression_algorithm=algorithm)
    np.testing.assert_array_equal(packed.as_numpy("output__0"), plain)


def test_images_as_bytes(live: Live) -> None:
    pngs = np.array([[sample_png(3)], [sample_png(7)]], dtype=np.object_)
    tensor = triton.InferInput("input__0", [2, 1], "BYTES")
    tensor.set_data_from_numpy(pngs)
    outputs = [triton.InferRequestedOutput("output__0", class_count=1)]
    top = live.client.infer("lenet", [tensor], outputs=outputs).as_numpy("output__0")
    assert [c.decode().split(":")[1:] for c in top[:, 0]] == [["3", "3"], ["7", "7"]]


# ---- errors through tritonclient ---------------------------------------------------------


def test_errors_reach_tritonclient(live: Live) -> None:
    x = digits(1)
    err = error_of(lambda: live.client.infer("nope", [infer_input(x)]))
    assert (err.status(), err.message()) == ("404", "no model named 'nope'; GET /models lists them")
    err = error_of(lambda: live.client.infer("lenet", [infer_input(x, name="images")]))
    assert err.status() == "422"
    assert err.message() == "unknown input 'images'; lenet takes 'input__0'"
    bad = np.zeros((1, 1, 32, 32), dtype=np.float32)
    err = error_of(lambda: live.client.infer("lenet", [infer_input(bad)]))
    assert err.message() == "input__0 has shape [1, 1, 32, 32]; lenet takes [-1, 3, 32, 32] (N samples first)"
    err = error_of(lambda: live.client.infer("lenet", [infer_input(x)], outputs=[triton.InferRequestedOutput("conv3")]))
    assert err.status() == "422"
    assert "unknown output 'conv3'" in err.message()
    assert "'conv1'" in err.message()
    many = digits(MAX_INPUTS + 1)
    err = error_of(lambda: live.client.infer("lenet", [infer_input(many)]))
    assert err.status() == "413"
    assert f"over the limit of {MAX_INPUTS}" in err.message()


# ---- repository extension ----------------------------------------------------------------


def test_unload_then_load(live: Live) -> None:
    client = live.client
    err = error_of(lambda: client.unload_model("lenet", headers={"Authorization": "Bearer wrong"}))
    assert (err.status(), err.message()) == ("401", "wrong admin token")
    client.unload_model("lenet", headers=AUTH)
    assert not client.is_model_ready("lenet")
    index = {m["name"]: m for m in client.get_model_repository_index()}
    assert index["lenet"] == {"name": "lenet", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}
    assert index["resnet18"]["state"] == "READY"
    err = error_of(lambda: client.infer("lenet", [infer_input(digits(1))]))
    assert err.status() == "404"
    client.load_model("lenet", headers=AUTH)
    assert client.is_model_ready("lenet")
    assert client.infer("lenet", [infer_input(digits(1))]).as_numpy("output__0").shape == (1, 10)
    assert {m["name"]: m["state"] for m in client.get_model_repository_index()}["lenet"] == "READY"
    err = error_of(lambda: client.load_model("ghost", headers=AUTH))
    assert err.status() == "404"


def test_a_model_deleted_over_rest_loads_back_through_the_repository(live: Live) -> None:
    base = f"http://{live.url}"
    gone = httpx.delete(f"{base}/models/lenet", headers=AUTH, timeout=60)
    assert gone.status_code == 200
    index = {m["name"]: m for m in live.client.get_model_repository_index()}
    assert index["lenet"]["state"] == "UNAVAILABLE"
    live.client.load_model("lenet", headers=AUTH)
    assert live.client.is_model_ready("lenet")
    assert httpx.get(f"{base}/models/lenet", timeout=10).json()["weights"].endswith("lenet_digits.pt")


def test_load_from_config(live: Live) -> None:
    config = json.dumps({"source": "python", "architecture": "service.zoo.lenet:LeNet", "input_size": [3, 32, 32]})
    live.client.load_model("lenet_random", headers=AUTH, config=config)
    assert live.client.is_model_ready("lenet_random")
    assert live.client.get_model_metadata("lenet_random")["outputs"][0]["shape"] == [-1, 10]
    err = error_of(lambda: live.client.load_model("lenet_random", headers=AUTH, config=config))
    assert (err.status(), err.message()) == (
        "409",
        "model 'lenet_random' is ready; unload it before loading a new config",
    )
    live.client.unload_model("lenet_random", headers=AUTH)
    assert not live.client.is_model_ready("lenet_random")
    broken = json.dumps({"source": "python", "architecture": "service.zoo.lenet:Missing"})
    err = error_of(lambda: live.client.load_model("broken", headers=AUTH, config=broken))
    assert err.status() == "409"
    assert err.message().startswith("model 'broken' failed to load: ")
    index = {m["name"]: m for m in live.client.get_model_repository_index()}
    assert index["broken"]["state"] == "UNAVAILABLE"
    assert index["broken"]["reason"] == err.message().removeprefix("model 'broken' failed to load: ")
    assert index["lenet_random"]["reason"] == "unloaded"
    ready = httpx.post(f"http://{live.url}/v2/repository/index", json={"ready": True}, timeout=30).json()
    assert "broken" not in {m["name"] for m in ready}
    assert {m["state"] for m in ready} == {"READY"}
    assert not live.client.is_server_ready()  # a failed model keeps the server unready
    live.client.unload_model("broken", headers=AUTH)
    assert live.client.is_server_ready()


# ---- raw HTTP: the error body shape and the binary framing --------------------------------


@pytest.fixture(scope="module")
def raw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """lenet only, and no admin token configured."""
    config = tmp_path_factory.mktemp("config") / "models.toml"
    config.write_text(LENET_ONLY)
    settings = Settings(config=config, model_dir=Path(ZOO_DIR), worker_threads=1, torch_threads=1)
    with TestClient(make_app(settings)) as client:
        deadline = time.monotonic() + 60
        while client.get("/models/lenet").json()["status"] == "loading":
            assert time.monotonic() < deadline, "lenet did not load"
            time.sleep(0.02)
        yield client


def infer_body(x: np.ndarray[Any, Any], **extra: Any) -> dict[str, Any]:
    return {
        "inputs": [{"name": "input__0", "shape": list(x.shape), "datatype": "FP32", "data": x.reshape(-1).tolist()}],
        **extra,
    }


@pytest.mark.parametrize(
    "case",
    [
        ("post", "/v2/models/nope/infer", b"{}", 404, "no model named 'nope'"),
        ("post", "/v2/models/lenet/infer", b"{not json", 400, "not valid JSON"),
        ("post", "/v2/models/lenet/infer", b'{"inputs": []}', 422, "inputs: List should have at least 1 item"),
        ("post", "/v2/models/lenet/infer", b'{"inputs": [], "extra": 1}', 422, "extra: Extra inputs"),
        ("get", "/v2/models/lenet/versions/3", None, 404, "no version '3'"),
        ("get", "/v2/nowhere", None, 404, "Not Found"),
        ("post", "/v2/repository/models/lenet/load", b"{}", 403, "no HOOKSERVE_ADMIN_TOKEN"),
        ("post", "/v2/repository/index", b"[1]", 422, "valid dictionary"),
    ],
)
def test_error_bodies(raw: TestClient, case: tuple[str, str, bytes | None, int, str]) -> None:
    method, path, content, status, message = case
    response = raw.request(method.upper(), path, content=content)
    assert response.status_code == status
    body = response.json()
    assert list(body) == ["error"]
    assert message in body["error"]


def test_binary_framing(raw: TestClient, lenet: LeNet) -> None:
    x = digits(2, seed=5)
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "input__0",
                    "shape": [2, 3, 32, 32],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ],
            "outputs": [{"name": "output__0", "parameters": {"binary_data": True}}, {"name": "fc3"}],
        }
    ).encode()
    response = raw.post(
        "/v2/models/lenet/infer",
        content=gzip.compress(header + x.tobytes()),
        headers={"Inference-Header-Content-Length": str(len(header)), "Content-Encoding": "gzip"},
    )
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/octet-stream"
    length = int(response.headers["inference-header-content-length"])
    head = json.loads(response.content[:length])
    assert head["outputs"][0] == {
        "name": "output__0",
        "datatype": "FP32",
        "shape": [2, 10],
        "parameters": {"binary_data_size": 80},
    }
    logits = np.frombuffer(response.content[length:], dtype="<f4").reshape(2, 10)
    with torch.no_grad():
        expected = lenet(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.array(head["outputs"][1]["data"]).reshape(2, 10), expected, rtol=1e-5, atol=1e-5)
    assert len(response.content) == length + 80


def test_json_only_answer_and_trailing_bytes(raw: TestClient) -> None:
    x = digits(1, seed=6)
    response = raw.post("/v2/models/lenet/infer", json=infer_body(x, id="a"))
    assert response.headers["content-type"] == "application/json"
    assert "inference-header-content-length" not in response.headers
    assert response.json()["id"] == "a"
    header = json.dumps(infer_body(x)).encode()
    response = raw.post(
        "/v2/models/lenet/infer",
        content=header + b"junk",
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert response.status_code == 400
    assert response.json() == {"error": "4 bytes after the JSON header that no input's binary_data_size claims"}


def test_an_answer_over_the_json_limit_is_refused_before_the_forward(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """conv1's output (6 x 28 x 28 numbers a digit) cannot fit a 4 KiB JSON answer: 413 without running the model,
    as REST refuses an answer too large on its estimate; as binary_data it is within its limit and runs."""
    forwards: list[str] = []
    infer = oip_plane._infer

    async def counted(served: Any, decoded: Any) -> Any:
        forwards.append(served.model.name)
        return await infer(served, decoded)

    monkeypatch.setattr(oip_plane, "_infer", counted)
    config = tmp_path / "models.toml"
    config.write_text(LENET_ONLY)
    settings = Settings(config=config, model_dir=Path(ZOO_DIR), worker_threads=1, max_json_response_bytes=4096)
    x = digits(1, seed=2)
    with TestClient(make_app(settings)) as client:
        wait_until(lambda: client.get("/models/lenet").json()["status"] == "ready", "lenet to load")
        as_json = {"outputs": [{"name": "conv1", "parameters": {"binary_data": False}}]}
        response = client.post("/v2/models/lenet/infer", json=infer_body(x, **as_json))
        assert response.status_code == 413, response.text
        assert "max_json_response_bytes" in response.json()["error"]
        assert forwards == []
        as_binary = {"outputs": [{"name": "conv1", "parameters": {"binary_data": True}}]}
        response = client.post("/v2/models/lenet/infer", json=infer_body(x, **as_binary))
        assert response.status_code == 200, response.text
        assert forwards == ["lenet"]
        big_logits = infer_body(digits(MAX_INPUTS, seed=3), parameters={"binary_data_output": False})
        assert client.post("/v2/models/lenet/infer", json=big_logits).status_code == 200  # 60 numbers fit


def test_bytes_input_in_json(raw: TestClient) -> None:
    """BYTES elements serialized by tritonclient's own helper round-trip through our decoder."""
    pngs = np.array([sample_png(5)], dtype=np.object_)
    payload = serialize_byte_tensor(pngs).item()
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "input__0",
                    "shape": [1],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(payload)},
                }
            ],
            "outputs": [{"name": "output__0", "parameters": {"classification": 1}}],
        }
    ).encode()
    response = raw.post(
        "/v2/models/lenet/infer",
        content=header + payload,
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert response.status_code == 200
    data = response.json()["outputs"][0]
    assert data["datatype"] == "BYTES"
    assert data["shape"] == [1, 1]
    assert data["data"][0].split(":")[1:] == ["5", "5"]


def test_openapi_documents_v2(raw: TestClient) -> None:
    schema = raw.get("/openapi.json").json()
    for path in ("/v2", "/v2/models/{name}/infer", "/v2/repository/index", "/v2/repository/models/{name}/load"):
        assert path in schema["paths"]
    components = schema["components"]["schemas"]
    assert {"InferRequest", "InferInputTensor", "InferResponse", "ModelMetadata", "ErrorV2"} <= set(components)
    body = schema["paths"]["/v2/models/{name}/infer"]["post"]["requestBody"]["content"]
    assert set(body) == {"application/json", "application/octet-stream"}
