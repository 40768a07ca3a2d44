"""The TorchServe-compatible front against a live server: archives made by torch-model-archiver, registered through
the management API on its own port, answered on the inference API as TorchServe's stock handler answers.

Expected answers are computed here the way TorchServe's `image_classifier` handler computes them
(torchvision's transforms on the PIL image, softmax, top 5, `index_to_name.json`), and compared
field by field with what the front says.
"""

from __future__ import annotations

import io
import json
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import requests
import torch
from captum.attr import IntegratedGradients
from PIL import Image
from torchvision import transforms

from service.config import Settings
from service.main import create_app
from tests.helpers.serving import uvicorn_thread
from tests.torchserve.archives import (
    CUSTOM_HANDLER,
    LABELS,
    archiver,
    build_sources,
    eager_archive,
    kitten,
    reference_model,
    rewritten,
    torchscript_archive,
    with_symlink,
)

ADMIN = "s3cret"
AUTH = {"Authorization": f"Bearer {ADMIN}"}
ARCHIVE_LIMIT = 2 * 1024 * 1024  # max_upload_bytes of the test server: the archives here are ~60 KB


@dataclass
class Live:
    url: str  # the inference API (hookserve's HTTP port)
    management: str
    store: Path  # the model dir
    http: httpx.Client


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    store = tmp_path_factory.mktemp("model_store")
    work = build_sources(tmp_path_factory.mktemp("sources"))
    eager_archive(work, store)
    torchscript_archive(work, store)
    archiver(
        "--model-name", "custom", "--version", "1.0", "--model-file", str(work / "model.py"),
        "--serialized-file", str(work / "weights.pt"), "--handler", str(work / "my_handler.py"),
        "--export-path", str(store),
    )  # fmt: skip
    (store / "models.toml").write_text(
        '[[models]]\nname = "lenet"\nsource = "python"\narchitecture = "service.zoo.lenet:LeNet"\n'
        "input_size = [3, 32, 32]\n"
    )
    settings = Settings(
        model_dir=store,
        config=store / "models.toml",
        worker_threads=1,
        torch_threads=1,
        admin_token=ADMIN,
        max_upload_bytes=ARCHIVE_LIMIT,
        torchserve_management_port=0,
    )
    app = create_app(settings)
    with uvicorn_thread(app) as base, httpx.Client(timeout=60) as http:
        management = f"http://127.0.0.1:{app.state.ports['torchserve_management']}"
        answer = http.post(f"{management}/models", params={"url": "tiny.mar", "synchronous": "true"}, headers=AUTH)
        assert answer.status_code == 200, answer.text
        yield Live(base, management, store, http)


def handler_input(data: bytes) -> torch.Tensor:
    """What TorchServe's ImageClassifier feeds the model (its `image_processing` on the PIL image)."""
    pipeline = transforms.Compose(
        [
            transforms.Resize(256),
            transforms.CenterCrop(224),
            transforms.ToTensor(),
            transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
        ]
    )
    tensor: torch.Tensor = pipeline(Image.open(io.BytesIO(data)))
    return tensor.unsqueeze(0)


def handler_answer(data: bytes) -> dict[str, float]:
    """TorchServe's ImageClassifier.postprocess: softmax, top 5, `{label: probability}` via index_to_name.json."""
    with torch.inference_mode():
        probs = torch.softmax(reference_model()(handler_input(data)), dim=1)
    values, classes = torch.topk(probs, 5, dim=1)
    return {LABELS[str(c)][-1]: v for c, v in zip(classes[0].tolist(), values[0].tolist(), strict=True)}


def assert_same_answer(text: str, expected: dict[str, float]) -> None:
    got = json.loads(text)
    assert list(got) == list(expected)  # the same labels, most likely first
    for label, probability in expected.items():
        assert got[label] == pytest.approx(probability, abs=2e-3)
    assert text == json.dumps(got, indent=2)  # written as TorchServe's worker writes it


# ---- the inference API -------------------------------------------------------------------


def test_ping(live: Live) -> None:
    answer = live.http.get(f"{live.url}/ping")
    assert answer.status_code == 200
    assert answer.json() == {"status": "Healthy"}


def test_curl_t_and_torchserve_examples_get_the_image_classifier_answer(live: Live) -> None:
    image = kitten()
    expected = handler_answer(image)
    # curl -T kitten.jpg http://host/predictions/tiny: the file as the body of a PUT
    assert_same_answer(live.http.put(f"{live.url}/predictions/tiny", content=image).text, expected)
    # TorchServe's own Python examples: requests, with the image as the body or as multipart `data`
    assert_same_answer(requests.post(f"{live.url}/predictions/tiny", data=image, timeout=60).text, expected)
    with_files = requests.post(f"{live.url}/predictions/tiny", files={"data": image}, timeout=60)
    assert_same_answer(with_files.text, expected)
    as_file = live.http.post(f"{live.url}/predictions/tiny/1.0", files={"file": ("kitten.jpg", image)})
    assert_same_answer(as_file.text, expected)


def test_explanations_are_integrated_gradients_as_torchserve_computes_them(live: Live) -> None:
    image = kitten()
    x = handler_input(image)
    for target, ask in ((0, {}), (3, {"target": "3"})):
        answer = live.http.post(f"{live.url}/explanations/tiny", files={"data": ("k.jpg", image)}, data=ask)
        assert answer.status_code == 200, answer.text
        got = np.asarray(answer.json(), dtype=np.float64)
        expected = IntegratedGradients(reference_model()).attribute(x, target=target, n_steps=15)[0]
        assert got.shape == (3, 224, 224)
        scale = float(expected.abs().max())
        np.testing.assert_allclose(got, expected.detach().numpy(), atol=0.02 * scale)


def test_errors_are_in_torchserves_envelope(live: Live) -> None:
    missing = live.http.post(f"{live.url}/predictions/nope", content=kitten())
    assert missing.status_code == 404
    assert missing.json() == {
        "code": 404,
        "type": "ModelNotFoundException",
        "message": "no model named 'nope'; GET /models lists them",
    }
    version = live.http.post(f"{live.url}/predictions/tiny/9.9", content=kitten())
    assert version.status_code == 404
    assert version.json()["message"] == "Model version: 9.9 does not exist for model: tiny"
    empty = live.http.post(f"{live.url}/predictions/tiny", content=b"")
    assert (empty.status_code, empty.json()["type"]) == (400, "BadRequestException")
    not_image = live.http.post(f"{live.url}/predictions/tiny", content=b"not an image")
    assert not_image.status_code == 400
    assert not_image.json()["type"] == "BadRequestException"


# ---- the management API ------------------------------------------------------------------


def test_list_and_describe_in_torchserves_fields(live: Live) -> None:
    listed = live.http.get(f"{live.management}/models").json()
    assert {"modelName": "tiny", "modelUrl": "tiny.mar"} in listed["models"]
    first = live.http.get(f"{live.management}/models", params={"limit": 1}).json()
    assert len(first["models"]) == 1
    assert first["nextPageToken"] == "1"
    described = live.http.get(f"{live.management}/models/tiny").json()
    assert len(described) == 1
    model = described[0]
    assert set(model) == {
        "modelName", "modelVersion", "modelUrl", "runtime", "minWorkers", "maxWorkers", "batchSize",
        "maxBatchDelay", "loadedAtStartup", "workers", "jobQueueStatus",
    }  # fmt: skip
    assert (model["modelName"], model["modelVersion"], model["modelUrl"]) == ("tiny", "1.0", "tiny.mar")
    assert model["workers"][0]["status"] == "READY"
    assert set(model["workers"][0]) == {"id", "startTime", "status", "memoryUsage", "pid", "gpu", "gpuUsage"}
    assert model["jobQueueStatus"] == {"remainingCapacity": 256, "pendingRequests": 0}
    assert live.http.get(f"{live.management}/models/tiny/all").json() == described
    gone = live.http.get(f"{live.management}/models/nope")
    assert (gone.status_code, gone.json()["type"]) == (404, "ModelNotFoundException")


def test_register_maps_batching_and_names_what_does_not_map(live: Live) -> None:
    params = {
        "url": "tiny.mar",
        "model_name": "tiny_batched",
        "batch_size": "4",
        "max_batch_delay": "20",
        "initial_workers": "3",
        "response_timeout": "5",
        "synchronous": "true",
    }
    answer = live.http.post(f"{live.management}/models", params=params, headers=AUTH)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["status"] == 'Model "tiny_batched" Version: 1.0 registered with 1 initial workers'
    assert set(body["notMapped"]) == {"initial_workers", "response_timeout"}
    model = live.http.get(f"{live.management}/models/tiny_batched").json()[0]
    assert (model["batchSize"], model["maxBatchDelay"]) == (4, 20)
    scaled = live.http.put(f"{live.management}/models/tiny_batched", params={"min_worker": "3"}, headers=AUTH)
    assert scaled.status_code == 200
    assert "unchanged" in scaled.json()["status"]
    assert "min_worker=3 not applied" in scaled.json()["status"]
    gone = live.http.delete(f"{live.management}/models/tiny_batched", headers=AUTH)
    assert gone.json() == {"status": 'Model "tiny_batched" unregistered'}
    assert live.http.post(f"{live.url}/predictions/tiny_batched", content=kitten()).status_code == 404


def test_a_torchscript_archive_answers_like_its_program(live: Live) -> None:
    answer = live.http.post(
        f"{live.management}/models", params={"url": "tiny_ts.mar", "synchronous": "true"}, headers=AUTH
    )
    assert answer.status_code == 200, answer.text
    image = kitten()
    got = live.http.post(f"{live.url}/predictions/tiny_ts/2.1", content=image)
    expected = {str(k).replace("class_", ""): v for k, v in handler_answer(image).items()}  # no labels: indices
    assert_same_answer(got.text, expected)
    live.http.delete(f"{live.management}/models/tiny_ts", headers=AUTH)


def test_registering_needs_the_admin_token(live: Live) -> None:
    missing = live.http.post(f"{live.management}/models", params={"url": "tiny.mar", "model_name": "x"})
    assert (missing.status_code, missing.json()["type"]) == (401, "InvalidKeyException")
    wrong = live.http.delete(f"{live.management}/models/tiny", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert live.http.get(f"{live.management}/models/tiny").status_code == 200


# ---- archives refused, and why -----------------------------------------------------------


def refused(live: Live, url: str, status: int, reason: str) -> None:
    before = set(Path(tempfile.gettempdir()).glob("hookserve-mar-*"))
    answer = live.http.post(f"{live.management}/models", params={"url": url, "synchronous": "true"}, headers=AUTH)
    assert answer.status_code == status, answer.text
    assert reason in answer.json()["message"]
    assert set(Path(tempfile.gettempdir()).glob("hookserve-mar-*")) <= before  # nothing extracted stays


def test_hostile_archives_are_refused_with_the_reason(live: Live) -> None:
    tiny = live.store / "tiny.mar"
    rewritten(tiny, live.store / "escape.mar", {"../../evil.py": b"raise SystemExit"})
    rewritten(tiny, live.store / "absolute.mar", {"/tmp/evil.py": b"raise SystemExit"})
    with_symlink(tiny, live.store / "link.mar")
    rewritten(tiny, live.store / "big.mar", {"padding.bin": np.random.default_rng(0).bytes(ARCHIVE_LIMIT)})
    rewritten(tiny, live.store / "nomanifest.mar", {}, drop=("MAR-INF/MANIFEST.json",))
    two = "import torch\nclass A(torch.nn.Module): pass\nclass B(torch.nn.Module): pass\n"
    rewritten(tiny, live.store / "two.mar", {"model.py": two.encode()})
    (live.store / "notzip.mar").write_bytes(b"not a zip")
    refused(live, "escape.mar", 400, "outside the archive's directory")
    refused(live, "absolute.mar", 400, "outside the archive's directory")
    refused(live, "link.mar", 400, "symbolic link")
    refused(live, "big.mar", 413, "max_upload_bytes")
    refused(live, "nomanifest.mar", 400, "no MAR-INF/MANIFEST.json")
    refused(live, "two.mar", 422, "defines 2 classes")
    refused(live, "notzip.mar", 400, "not a model archive")
    refused(live, "custom.mar", 422, "custom Python code")
    refused(live, "../outside.mar", 403, "outside the model dir")
    refused(live, "https://example.com/x.mar", 400, "downloads nothing")
    refused(live, "missing.mar", 404, "no file")
    assert CUSTOM_HANDLER  # the custom archive's handler, never imported


def test_an_archive_that_lies_about_its_sizes_is_refused(live: Live) -> None:
    """A member whose data inflates past the size its directory entry declares is cut off, not written."""
    target = live.store / "liar.mar"
    rewritten(live.store / "tiny.mar", target, {"extra.bin": b"\0" * 200_000})
    data = bytearray(target.read_bytes())
    with zipfile.ZipFile(target) as archive:
        info = archive.getinfo("extra.bin")
    entry = data.rfind(b"PK\x01\x02", 0, len(data))  # the central directory entries: patch extra.bin's size
    while entry != -1:
        name_length = int.from_bytes(data[entry + 28 : entry + 30], "little")
        if data[entry + 46 : entry + 46 + name_length] == b"extra.bin":
            data[entry + 24 : entry + 28] = (1000).to_bytes(4, "little")
            break
        entry = data.rfind(b"PK\x01\x02", 0, entry)
    assert info.file_size == 200_000
    target.write_bytes(bytes(data))
    refused(live, "liar.mar", 400, "extra.bin")


def test_statistics_count_the_torchserve_front_too(live: Live) -> None:
    def count() -> Any:
        return live.http.get(f"{live.url}/v2/models/tiny/stats").json()["model_stats"][0]["inference_count"]

    before = count()
    live.http.put(f"{live.url}/predictions/tiny", content=kitten())
    assert count() == before + 1
