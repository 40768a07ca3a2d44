"""/jobs through the HTTP API: unit statistics and exemplars over digits and an image folder equal a hand
loop; bad requests are clear 4xx; cancel stops a job; a restarted server resumes a running one."""

from __future__ import annotations

import hashlib
import io
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from PIL import Image
from sklearn.datasets import load_digits

from service.client.features import read_features
from service.codecs.pictures import exemplar_maps_png
from service.codecs.preprocess import preprocess_image
from service.config import Settings
from service.introspection.unit_stats import units
from service.main import create_app
from service.zoo.lenet import LeNet, lenet_preprocess_spec
from tests.api.test_interventions import edited_logits
from tests.conftest import direct_capture, hooks, tensor_input, wait_settled, write_lenet
from tests.helpers.cka import textbook_cka

TOKEN = "jobs-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SAMPLES = 200
LAYERS = ["conv1", "conv2", "fc1"]


def digit_image(values: np.ndarray) -> Image.Image:
    return Image.fromarray(np.clip(values * 16, 0, 255).astype(np.uint8))


def settings_for(root: Path, **overrides: Any) -> Settings:
    config = root / "models.toml"
    if not config.exists():
        config.write_text(write_lenet(root))
    values: dict[str, Any] = {
        "model_dir": root,
        "config": config,
        "admin_token": TOKEN,
        "data_dir": root / "data",
        "jobs_dir": root / "jobs",
        "worker_threads": 1,
        "job_chunk_size": 32,
        "job_checkpoint_s": 60.0,
        "max_job_bytes": 1024 * 1024,
    }
    return Settings(**(values | overrides))


def write_folder(data: Path) -> list[tuple[str, int]]:
    """`data/shapes/{even,odd}/` PNGs of the first 24 digits and a corrupt file in `odd`, `data/jpegs/` the same
    digits as 64 px JPEGs; (file, label) of `shapes` in order."""
    digits = load_digits()
    for i in range(24):
        folder = data / "shapes" / ("even" if digits.target[i] % 2 == 0 else "odd")
        folder.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        digit_image(digits.images[i]).save(buf, format="PNG")
        (folder / f"d{i:02d}.png").write_bytes(buf.getvalue())
        jpeg = data / "jpegs" / folder.name
        jpeg.mkdir(parents=True, exist_ok=True)
        digit_image(digits.images[i]).resize((64, 64)).save(jpeg / f"d{i:02d}.jpg", format="JPEG", quality=90)
    (data / "shapes" / "odd" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    (data / "empty" / "cls").mkdir(parents=True)
    (data / "empty" / "cls" / "notes.txt").write_text("no images here")
    files = sorted(
        (p.relative_to(data / "shapes").as_posix(), 0 if p.parent.name == "even" else 1)
        for p in (data / "shapes").rglob("*.png")
    )
    return files


@pytest.fixture(scope="module")
def jobs_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    root = tmp_path_factory.mktemp("jobs")
    write_folder(root / "data")
    with TestClient(create_app(settings_for(root))) as client:
        wait_settled(client)
        yield client


def run_job(client: TestClient, body: dict[str, Any], timeout: float = 120.0) -> tuple[dict[str, Any], Any]:
    """Start a job, wait for it to end; (its final state, its result or None)."""
    answer = client.post("/jobs", json=body, headers=AUTH)
    assert answer.status_code == 202, answer.text
    assert answer.headers["location"] == f"/jobs/{answer.json()['id']}"
    info = wait_ended(client, answer.json()["id"], timeout)
    result = client.get(f"/jobs/{info['id']}/result", headers=AUTH)
    return info, result.json() if result.status_code == 200 else None


def wait_ended(client: TestClient, job_id: str, timeout: float = 120.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info: dict[str, Any] = client.get(f"/jobs/{job_id}", headers=AUTH).json()
        if info["state"] not in ("queued", "running"):
            return info
        time.sleep(0.05)
    raise TimeoutError(f"job {job_id} still running")


def digits_batch(n: int) -> tuple[torch.Tensor, np.ndarray]:
    digits = load_digits()
    spec = lenet_preprocess_spec()
    x = torch.stack([preprocess_image(digit_image(v), spec, 3) for v in digits.images[:n]])
    return x, digits.target[:n]


@pytest.fixture(scope="module")
def reference(lenet: LeNet) -> dict[str, torch.Tensor]:
    """Each layer's output over the first SAMPLES digits, captured by hand in one forward."""
    x, _ = digits_batch(SAMPLES)
    return {name: sides["output"] for name, sides in direct_capture(lenet, LAYERS, x).items()}


def assert_close(got: list[float], expected: torch.Tensor) -> None:
    torch.testing.assert_close(torch.tensor(got, dtype=torch.float64), expected, rtol=1e-5, atol=1e-6)


def test_unit_stats_equal_a_hand_loop(jobs_client: TestClient, reference: dict[str, torch.Tensor]) -> None:
    body = {"kind": "unit_stats", "model": "lenet", "dataset": "digits", "layers": ["conv*", "fc1"], "limit": SAMPLES}
    info, result = run_job(jobs_client, {**body, "parameters": {"bins": 16}})
    assert info["state"] == "succeeded", info
    assert (info["done"], info["total"], info["progress"], info["layers"]) == (SAMPLES, SAMPLES, 1.0, LAYERS)
    for name in LAYERS:
        v = units(reference[name]).transpose(0, 1).reshape(units(reference[name]).shape[1], -1)  # [U, values]
        got = result["layers"][name]
        assert got["count"] == v.shape[1]
        assert_close(got["mean"], v.mean(dim=1))
        assert_close(got["std"], v.std(dim=1, unbiased=False))
        assert_close(got["max"], v.amax(dim=1))
        assert_close(got["fraction_positive"], (v > 0).double().mean(dim=1))
        edges = np.array(got["histogram"]["edges"])
        counts = np.stack([np.histogram(row, bins=edges)[0] for row in v.numpy()])
        first_chunk = units(reference[name][:32])  # the default range: the first chunk's min and max
        assert edges[0] == pytest.approx(float(first_chunk.min()), rel=1e-6)
        assert edges[-1] == pytest.approx(float(first_chunk.max()), rel=1e-6)
        inside = np.array(got["histogram"]["counts"])
        outside = np.array(got["histogram"]["under"]) + np.array(got["histogram"]["over"])
        assert (inside.sum(axis=1) + outside == v.shape[1]).all()
        assert np.abs(inside - counts).sum() <= 2 * v.shape[0]  # values on a bucket edge may round either way
    assert hooks(jobs_client, "lenet") == 0


def test_unit_stats_with_a_given_range_count_what_falls_outside(
    jobs_client: TestClient, reference: dict[str, torch.Tensor]
) -> None:
    body = {"kind": "unit_stats", "model": "lenet", "dataset": "digits", "layers": ["fc1"], "limit": SAMPLES}
    _, result = run_job(jobs_client, {**body, "parameters": {"bins": 4, "range": [0.0, 1.0]}})
    v = reference["fc1"].double().T
    hist = result["layers"]["fc1"]["histogram"]
    assert hist["edges"] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert hist["under"] == (v < 0).sum(dim=1).tolist()
    assert hist["over"] == (v > 1).sum(dim=1).tolist()


@pytest.mark.parametrize("score", ["max", "mean"])
def test_exemplars_equal_a_hand_loop(jobs_client: TestClient, reference: dict[str, torch.Tensor], score: str) -> None:
    body = {"kind": "exemplars", "model": "lenet", "dataset": "digits", "layers": LAYERS, "limit": SAMPLES}
    info, result = run_job(jobs_client, {**body, "parameters": {"k": 5, "score": score}})
    assert info["state"] == "succeeded", info
    _, labels = digits_batch(SAMPLES)
    assert result["classes"] == [str(i) for i in range(10)]
    for name in LAYERS:
        v = units(reference[name])
        scores = (v.amax(dim=2) if score == "max" else v.mean(dim=2)).T  # [U, N]
        for unit, found in enumerate(result["layers"][name]):
            expected = sorted(range(SAMPLES), key=lambda i: (-float(scores[unit, i]), i))[:5]
            assert [s["index"] for s in found] == expected
            assert [s["label"] for s in found] == [int(labels[i]) for i in expected]
            assert_close([s["score"] for s in found], scores[unit, expected])


def test_exemplar_maps_show_the_unit_over_its_top_samples(jobs_client: TestClient, lenet: LeNet) -> None:
    body = {"kind": "exemplars", "model": "lenet", "dataset": "digits", "layers": ["conv2", "fc1"], "limit": SAMPLES}
    info, result = run_job(jobs_client, {**body, "parameters": {"k": 4}})
    url = f"/jobs/{info['id']}/exemplars.png"
    answer = jobs_client.get(url, params={"layer": "conv2", "unit": 3}, headers=AUTH)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "image/png"
    got = np.asarray(Image.open(io.BytesIO(answer.content)).convert("RGB")).astype(int)
    assert got.shape == (128, 4 * 128 + 3 * 2, 3)  # four 32 px digits enlarged to 128 px, in one row
    x, _ = digits_batch(SAMPLES)
    top = x[[s["index"] for s in result["layers"]["conv2"][3]]]
    maps = direct_capture(lenet, ["conv2"], top)["conv2"]["output"][:, 3]
    want = np.asarray(Image.open(io.BytesIO(exemplar_maps_png(top, maps, lenet_preprocess_spec(), 0.5))))
    assert np.abs(got - want.astype(int)).max() <= 1
    assert got[:, :128].std() > 10  # an image, not a flat tile
    cases: list[tuple[dict[str, str | int], str]] = [
        ({"layer": "fc1", "unit": 0}, "feature map"),
        ({"layer": "conv2", "unit": 16}, "units 0..15"),
        ({"layer": "conv9", "unit": 0}, "ranked no layer"),
    ]
    for params, words in cases:
        refused = jobs_client.get(url, params=params, headers=AUTH)
        assert refused.status_code == 422, refused.text
        assert words in refused.text
    stats, _ = run_job(jobs_client, BASE)
    wrong_kind = jobs_client.get(f"/jobs/{stats['id']}/exemplars.png", params={"layer": "fc1", "unit": 0}, headers=AUTH)
    assert wrong_kind.status_code == 422
    assert jobs_client.get(url, params={"layer": "conv2", "unit": 3}).status_code == 401


@pytest.mark.parametrize(("reduce", "layers"), [("mean", LAYERS), ("flatten", ["fc1", "fc2", "fc3"])])
def test_similarity_is_linear_cka_on_the_full_gram_matrices(
    jobs_client: TestClient, lenet: LeNet, reduce: str, layers: list[str]
) -> None:
    """Over 200 digits in chunks of 32, every pair of layers, each sample's per-unit means or every value."""
    body = {"kind": "similarity", "model": "lenet", "dataset": "digits", "layers": layers, "limit": SAMPLES}
    info, result = run_job(jobs_client, {**body, "parameters": {"reduce": reduce}})
    assert info["state"] == "succeeded", info
    x, _ = digits_batch(SAMPLES)
    captured = {name: sides["output"] for name, sides in direct_capture(lenet, layers, x).items()}
    features = {name: units(t).mean(dim=2) if reduce == "mean" else t for name, t in captured.items()}
    assert result["layers"] == layers
    assert result["features"] == {name: int(t[0].numel()) for name, t in features.items()}
    expected = [[textbook_cka(features[a], features[b]) for b in layers] for a in layers]
    torch.testing.assert_close(torch.tensor(result["cka"]), torch.tensor(expected), rtol=0, atol=1e-4)
    assert all(result["cka"][i][i] == pytest.approx(1.0) for i in range(len(layers)))
    assert min(min(row) for row in result["cka"]) > 0.0


def test_similarity_refuses_one_layer_and_names_reduce_when_too_large(jobs_client: TestClient) -> None:
    body = {"kind": "similarity", "model": "lenet", "dataset": "digits", "limit": 8}
    one = jobs_client.post("/jobs", json=body | {"layers": ["fc1"]}, headers=AUTH)
    assert one.status_code == 422, one.text
    assert "at least two layers" in one.text
    # conv1 and conv2 flattened: 4704 + 1600 features, a cross-covariance of ~300 MiB
    large = jobs_client.post(
        "/jobs", json=body | {"layers": ["conv1", "conv2"], "parameters": {"reduce": "flatten"}}, headers=AUTH
    )
    assert large.status_code == 413, large.text
    assert "max_job_bytes" in large.text
    assert '"mean"' in large.json()["detail"]


FEATURES = {"kind": "features", "model": "lenet", "dataset": "digits", "layers": ["conv2", "fc1"], "limit": SAMPLES}
FEATURE_PARAMETERS = {"reduce": "mean", "shard_size": 64}


def download(client: TestClient, job: dict[str, Any], result: dict[str, Any], folder: Path) -> Path:
    folder.mkdir()
    for name in result["files"]:
        answer = client.get(f"/jobs/{job['id']}/files/{name}", headers=AUTH)
        assert answer.status_code == 200, answer.text
        (folder / name).write_bytes(answer.content)
    return folder


def test_features_are_shards_that_read_features_reads_as_a_hand_capture(
    jobs_client: TestClient, reference: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    info, result = run_job(jobs_client, {**FEATURES, "parameters": FEATURE_PARAMETERS})
    assert info["state"] == "succeeded", info
    assert result["rows"] == SAMPLES
    assert [s["rows"] for s in result["shards"]] == [64, 64, 64, 8]
    assert result["files"] == ["index.json", *(f"features-{i:05d}.safetensors" for i in range(4))]
    folder = download(jobs_client, info, result, tmp_path / "features")
    for layer, expected in (("conv2", units(reference["conv2"]).mean(dim=2)), ("fc1", reference["fc1"])):
        names, values = read_features(folder, f"{layer}:output")
        assert names == [f"digits/{i}" for i in range(SAMPLES)]
        torch.testing.assert_close(torch.from_numpy(values), expected.float(), rtol=1e-5, atol=1e-5)
    for shard in result["shards"]:
        assert hashlib.sha256((folder / shard["file"]).read_bytes()).hexdigest() == shard["sha256"]
    for name, status in (("checkpoint.safetensors", 404), ("../jobs.sqlite", 404), (".hidden", 404)):
        assert jobs_client.get(f"/jobs/{info['id']}/files/{name}", headers=AUTH).status_code == status, name
    assert jobs_client.get(f"/jobs/{info['id']}/files/index.json").status_code == 401


def test_a_features_job_resumed_after_a_restart_writes_the_same_bytes(jobs_client: TestClient, tmp_path: Path) -> None:
    # 800 rows in chunks of 4: the stop after the first shard lands long before the job's end, on a busy machine too
    body = {**FEATURES, "limit": 800, "parameters": FEATURE_PARAMETERS}
    _, whole = run_job(jobs_client, body)
    settings = settings_for(tmp_path, job_chunk_size=4, job_checkpoint_s=0.0)
    with TestClient(create_app(settings)) as client:
        wait_settled(client)
        job_id = client.post("/jobs", json=body, headers=AUTH).json()["id"]
        deadline = time.monotonic() + 60
        while client.get(f"/jobs/{job_id}", headers=AUTH).json()["done"] < 100:  # past the first shard
            assert time.monotonic() < deadline
            time.sleep(0.01)
    with TestClient(create_app(settings)) as client:
        ended = wait_ended(client, job_id)
        assert ended["state"] == "succeeded", ended
        assert ended["resumed_from"] is not None
        resumed = client.get(f"/jobs/{job_id}/result", headers=AUTH).json()
    assert resumed["shards"] == whole["shards"]  # rows, sizes and SHA-256 of every shard


STEER = {"kind": "steering_vector", "model": "lenet", "dataset": "digits", "layers": ["fc1"], "limit": SAMPLES}


def test_a_steering_vector_is_the_difference_of_class_means_and_interventions_add_it_by_name(
    jobs_client: TestClient, lenet: LeNet
) -> None:
    parameters = {"positive": "3", "negative": "7", "name": "three-minus-seven"}
    info, result = run_job(jobs_client, {**STEER, "parameters": parameters})
    assert info["state"] == "succeeded", info
    x, labels = digits_batch(SAMPLES)
    fc1 = direct_capture(lenet, ["fc1"], x)["fc1"]["output"].double()
    expected = (fc1[labels == 3].mean(dim=0) - fc1[labels == 7].mean(dim=0)).float()
    assert result["positive"] == {"class": "3", "count": int((labels == 3).sum())}
    assert result["negative"] == {"class": "7", "count": int((labels == 7).sum())}
    assert (result["layer"], result["shape"]) == ("fc1", [120])
    listed = jobs_client.get("/vectors", headers=AUTH).json()["vectors"]
    assert [(v["name"], v["model"], v["layer"], v["job"]) for v in listed] == [
        ("three-minus-seven", "lenet", "fc1", info["id"])
    ]
    assert listed[0]["norm"] == pytest.approx(float(expected.norm()), rel=1e-5)

    inputs = [tensor_input(t) for t in x[:2]]
    edit = {"site": "fc1", "op": "add", "vector": "three-minus-seven", "scale": 2.0}
    answer = jobs_client.post(
        "/interventions", json={"model": "lenet", "inputs": inputs, "edits": [edit], "include_logits": True}
    )
    assert answer.status_code == 200, answer.text
    edited = torch.tensor([p["logits"] for p in answer.json()["edited"]])
    want = edited_logits(lenet, x[:2], {"fc1": lambda t: t + 2.0 * expected})
    torch.testing.assert_close(edited, want, rtol=1e-4, atol=1e-4)

    for wrong, words in (
        ({"site": "conv1"}, "was taken at the output of 'fc1'"),
        ({"vector": "nope"}, "GET /vectors"),
        ({"value": 1.0}, "exactly one of"),
    ):
        refused = jobs_client.post("/interventions", json={"model": "lenet", "inputs": inputs, "edits": [edit | wrong]})
        assert refused.status_code == 422, refused.text
        assert words in refused.text
    again = jobs_client.post("/jobs", json={**STEER, "parameters": parameters}, headers=AUTH)
    assert again.status_code == 409, again.text
    assert jobs_client.delete("/vectors/three-minus-seven", headers=AUTH).status_code == 200
    assert jobs_client.get("/vectors/three-minus-seven", headers=AUTH).status_code == 404
    gone = jobs_client.post("/interventions", json={"model": "lenet", "inputs": inputs, "edits": [edit]})
    assert gone.status_code == 422
    assert jobs_client.get("/vectors", headers=AUTH).status_code == 200
    assert jobs_client.get("/vectors").status_code == 401


@pytest.mark.parametrize(
    ("parameters", "layers", "words"),
    [
        ({"positive": "3", "negative": "7"}, ["fc1"], "needs parameters.name"),
        ({"positive": "3", "negative": "3", "name": "v"}, ["fc1"], "two different classes"),
        ({"positive": "3", "negative": "cat", "name": "v"}, ["fc1"], "no class 'cat'"),
        ({"positive": "3", "negative": "7", "name": "v"}, ["fc1", "fc2"], "one layer output"),
        ({"positive": "3", "negative": "7", "name": "../v"}, ["fc1"], "steering vector name"),
    ],
)
def test_bad_steering_jobs_are_refused_clearly(
    jobs_client: TestClient, parameters: dict[str, Any], layers: list[str], words: str
) -> None:
    answer = jobs_client.post("/jobs", json=STEER | {"layers": layers, "parameters": parameters}, headers=AUTH)
    assert answer.status_code == 422, answer.text
    assert words in answer.text


def test_an_image_folder_gives_labels_and_files_and_lists_unreadable_ones(
    jobs_client: TestClient, lenet: LeNet
) -> None:
    body = {"kind": "exemplars", "model": "lenet", "dataset": "shapes", "layers": ["fc3"], "parameters": {"k": 3}}
    info, result = run_job(jobs_client, body)
    assert info["state"] == "succeeded", info
    assert info["total"] == 25
    assert info["error_count"] == 1
    [error] = info["errors"]
    assert error["file"] == "odd/broken.png"
    assert "not a decodable image" in error["detail"]
    assert result["classes"] == ["even", "odd"]
    files = sorted(p for p in (Path(jobs_client.app.state.hookserve.settings.data_dir) / "shapes").rglob("d*.png"))  # type: ignore[attr-defined]
    spec = lenet_preprocess_spec()
    x = torch.stack([preprocess_image(Image.open(p), spec, 3) for p in files])
    with torch.no_grad():
        logits = lenet(x)
    names = [p.parent.name + "/" + p.name for p in files]
    for unit, found in enumerate(result["layers"]["fc3"]):
        order = sorted(range(len(files)), key=lambda i: (-float(logits[i, unit]), i))[:3]
        assert [s["file"] for s in found] == [names[i] for i in order]
        assert [s["label"] for s in found] == [0 if names[i].startswith("even") else 1 for i in order]


def test_unit_stats_over_a_jpeg_folder_equal_a_hand_loop(jobs_client: TestClient, lenet: LeNet) -> None:
    """64 px JPEGs, decoded and resized by the model's preprocessing as a /predict upload would be."""
    body = {"kind": "unit_stats", "model": "lenet", "dataset": "jpegs", "layers": ["conv1"], "parameters": {"bins": 8}}
    info, result = run_job(jobs_client, body)
    assert info["state"] == "succeeded", info
    assert (info["total"], info["error_count"]) == (24, 0)
    folder = Path(jobs_client.app.state.hookserve.settings.data_dir) / "jpegs"  # type: ignore[attr-defined]
    files = sorted(folder.rglob("*.jpg"), key=lambda p: (p.parent.name, p.name))
    spec = lenet_preprocess_spec()
    x = torch.stack([preprocess_image(Image.open(p), spec, 3) for p in files])
    v = units(direct_capture(lenet, ["conv1"], x)["conv1"]["output"])
    flat = v.transpose(0, 1).reshape(v.shape[1], -1)
    got = result["layers"]["conv1"]
    assert got["count"] == flat.shape[1]
    assert_close(got["mean"], flat.mean(dim=1))
    assert_close(got["std"], flat.std(dim=1, unbiased=False))
    assert_close(got["max"], flat.amax(dim=1))


def test_a_server_that_runs_no_job_writes_nothing(tmp_path: Path) -> None:
    settings = settings_for(tmp_path)
    with TestClient(create_app(settings)) as client:
        wait_settled(client)
        assert client.get("/jobs", headers=AUTH).json() == {"jobs": []}
        assert client.get("/jobs/nope", headers=AUTH).status_code == 404
    assert not (tmp_path / "jobs").exists()


def test_jobs_need_the_admin_token(jobs_client: TestClient) -> None:
    assert jobs_client.get("/jobs").status_code == 401
    assert jobs_client.get("/jobs", headers={"Authorization": "Bearer wrong"}).status_code == 401
    body = {"kind": "unit_stats", "model": "lenet", "dataset": "digits", "layers": ["fc1"]}
    assert jobs_client.post("/jobs", json=body).status_code == 401
    assert jobs_client.get("/jobs/anything/result").status_code == 401


BASE = {"kind": "unit_stats", "model": "lenet", "dataset": "digits", "layers": ["fc1"], "limit": 8}


@pytest.mark.parametrize(
    ("change", "status", "words"),
    [
        ({"dataset": "../models"}, 403, "outside the data dir"),
        ({"dataset": "/etc"}, 403, "absolute paths are refused"),
        ({"dataset": "nowhere"}, 404, "no dataset folder"),
        ({"dataset": "empty"}, 422, "holds no images"),
        ({"layers": ["nope"]}, 422, "nope"),
        ({"model": "nope"}, 404, "nope"),
        ({"kind": "tsne"}, 422, "kind"),
        ({"limit": 0}, 422, "limit"),
        ({"parameters": {"range": [1.0, 0.0]}}, 422, "lo < hi"),
        ({"parameters": {"bins": 2}, "surplus": 1}, 422, "surplus"),
        ({"layers": ["*"], "parameters": {"bins": 1024}}, 413, "max_job_bytes"),
    ],
)
def test_bad_jobs_are_refused_clearly(jobs_client: TestClient, change: dict[str, Any], status: int, words: str) -> None:
    answer = jobs_client.post("/jobs", json=BASE | change, headers=AUTH)
    assert answer.status_code == status, answer.text
    assert words in answer.text


def test_deleting_a_finished_job_removes_its_files(jobs_client: TestClient) -> None:
    info, _ = run_job(jobs_client, BASE)
    folder = Path(jobs_client.app.state.hookserve.settings.jobs_dir) / info["id"]  # type: ignore[attr-defined]
    assert (folder / "result.json").is_file()
    assert jobs_client.delete(f"/jobs/{info['id']}", headers=AUTH).status_code == 200
    assert not folder.exists()
    assert jobs_client.get(f"/jobs/{info['id']}/result", headers=AUTH).status_code == 404


def test_unknown_jobs_are_404(jobs_client: TestClient) -> None:
    for method, path in (("GET", "/jobs/nope"), ("DELETE", "/jobs/nope"), ("GET", "/jobs/nope/result")):
        answer = jobs_client.request(method, path, headers=AUTH)
        assert answer.status_code == 404
        assert "GET /jobs" in answer.text


def test_cancel_stops_a_job(jobs_client: TestClient) -> None:
    body = {"kind": "exemplars", "model": "lenet", "dataset": "digits", "layers": ["conv1"]}
    started = jobs_client.post("/jobs", json=body, headers=AUTH).json()
    cancelled = jobs_client.delete(f"/jobs/{started['id']}", headers=AUTH)
    assert cancelled.status_code == 200
    info = cancelled.json()
    assert info["state"] == "cancelled"
    assert info["done"] < info["total"] == 1797
    time.sleep(0.3)
    assert jobs_client.get(f"/jobs/{started['id']}", headers=AUTH).json()["done"] == info["done"]
    assert jobs_client.get(f"/jobs/{started['id']}/result", headers=AUTH).status_code == 409
    assert started["id"] in [job["id"] for job in jobs_client.get("/jobs", headers=AUTH).json()["jobs"]]
    deleted = jobs_client.delete(f"/jobs/{started['id']}", headers=AUTH)  # a finished job: deleted
    assert deleted.status_code == 200
    assert deleted.json()["state"] == "cancelled"
    assert jobs_client.get(f"/jobs/{started['id']}", headers=AUTH).status_code == 404
    assert hooks(jobs_client, "lenet") == 0


def test_a_restarted_server_resumes_a_running_job(tmp_path: Path, reference: dict[str, torch.Tensor]) -> None:
    settings = settings_for(tmp_path, job_chunk_size=2, job_checkpoint_s=0.0)  # a checkpoint after every chunk
    body = {"kind": "unit_stats", "model": "lenet", "dataset": "digits", "layers": ["conv2"], "limit": SAMPLES}
    with TestClient(create_app(settings)) as client:
        wait_settled(client)
        job_id = client.post("/jobs", json=body, headers=AUTH).json()["id"]
        deadline = time.monotonic() + 60
        while (info := client.get(f"/jobs/{job_id}", headers=AUTH).json())["done"] < 20:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    assert info["state"] == "running"
    assert info["done"] < SAMPLES
    assert info["rate"] > 0
    assert info["eta_s"] > 0
    assert info["resumed_from"] is None
    with TestClient(create_app(settings)) as client:
        ended = wait_ended(client, job_id)
        assert ended["state"] == "succeeded", ended
        assert 20 - 2 <= ended["resumed_from"] < SAMPLES  # from the last checkpoint, not from the start
        result = client.get(f"/jobs/{job_id}/result", headers=AUTH).json()
    v = units(reference["conv2"])
    flat = v.transpose(0, 1).reshape(v.shape[1], -1)
    got = result["layers"]["conv2"]
    assert got["count"] == flat.shape[1]  # every sample once: none skipped, none counted twice
    assert_close(got["mean"], flat.mean(dim=1))
    assert_close(got["std"], flat.std(dim=1, unbiased=False))
