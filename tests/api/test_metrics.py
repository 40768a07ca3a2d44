"""GET /metrics: parses as Prometheus text, counts by route template, reads the registry at scrape time."""

from __future__ import annotations

import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import prometheus_client
import pytest
import torch
from fastapi.testclient import TestClient
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from service.api.metrics import device_memory_families, job_observer, metrics_of
from service.api.observability import ObservabilityMiddleware, install_observability
from service.config import Settings
from service.main import create_app
from service.runtime.executor import JobRecord
from service.runtime.jobs import JobKind
from tests.conftest import ClientFactory, tensor_input
from tests.helpers.config import toy_entry
from tests.helpers.held import hold_rows, queued_behind_hold
from tests.helpers.models import WIDTH, new_gate

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(client: TestClient) -> Samples:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def wait_settled(client: TestClient) -> None:
    deadline = time.monotonic() + 60
    while any(m["status"] == "loading" for m in client.get("/models").json()["models"]):
        assert time.monotonic() < deadline, "models still loading"
        time.sleep(0.02)


def observed_client(settings: Settings) -> TestClient:
    return TestClient(create_app(settings))


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """The built-in registry (lenet, resnet18, efficientvit_b0) with metrics installed."""
    settings = Settings(model_dir=tmp_path_factory.mktemp("models"), worker_threads=1, torch_threads=1)
    with observed_client(settings) as c:
        wait_settled(c)
        yield c


def lenet_inputs(n: int) -> list[dict[str, object]]:
    gen = torch.Generator().manual_seed(0)
    return [
        {"tensor": {"shape": [3, 32, 32], "dtype": "float32", "data": torch.rand(3, 32, 32, generator=gen).tolist()}}
        for _ in range(n)
    ]


def test_model_gauges_are_read_from_the_registry(client: TestClient) -> None:
    samples = scrape(client)
    for name in ("lenet", "resnet18", "efficientvit_b0"):
        assert value(samples, "hookserve_model_state", model=name, state="ready") == 1.0
        assert value(samples, "hookserve_model_state", model=name, state="loading") == 0.0
        assert value(samples, "hookserve_model_state", model=name, state="failed") == 0.0
        assert value(samples, "hookserve_model_load_seconds", model=name) > 0.0
        assert ("hookserve_queue_depth", frozenset({("model", name)})) in samples
    if not torch.cuda.is_available():
        assert not any(name.startswith("hookserve_device_memory") for name, _ in samples)


def test_predict_moves_request_latency_and_batch_metrics(client: TestClient) -> None:
    def requests_ok(samples: Samples) -> float:  # the model label comes from the router (set_request_model)
        return sum(
            v
            for (name, labels), v in samples.items()
            if name == "hookserve_requests_total"
            and {("route", "/predict"), ("method", "POST"), ("status", "200")} <= labels
        )

    before = scrape(client)
    for _ in range(2):
        response = client.post("/predict", json={"model": "lenet", "inputs": lenet_inputs(3), "top_k": 1})
        assert response.status_code == 200, response.text
    after = scrape(client)

    assert requests_ok(after) - requests_ok(before) == 2
    latency = "hookserve_request_duration_seconds_count"
    assert (
        value(after, latency, route="/predict", method="POST") - value(before, latency, route="/predict", method="POST")
        == 2
    )
    # two sequential requests of 3 samples each: two batches of exactly 3
    assert (
        value(after, "hookserve_batch_size_count", model="lenet")
        - value(before, "hookserve_batch_size_count", model="lenet")
        == 2
    )
    assert (
        value(after, "hookserve_batch_size_sum", model="lenet")
        - value(before, "hookserve_batch_size_sum", model="lenet")
        == 6
    )
    for name in ("hookserve_job_queue_seconds_count", "hookserve_job_compute_seconds_count"):
        assert (
            value(after, name, model="lenet", kind="predict") - value(before, name, model="lenet", kind="predict") == 2
        )
    ran = "hookserve_job_compute_seconds_sum"
    assert value(after, ran, model="lenet", kind="predict") > value(before, ran, model="lenet", kind="predict")
    bucket = "hookserve_batch_size_bucket"
    assert value(after, bucket, model="lenet", le="2.0") == value(before, bucket, model="lenet", le="2.0")
    assert value(after, bucket, model="lenet", le="4.0") - value(before, bucket, model="lenet", le="4.0") == 2


def test_queue_depth_and_queue_wait_move_while_jobs_are_held_back(make_client: ClientFactory) -> None:
    """Three predictions queue behind a held one: the depth gauge reads 1, 2, 3 (the helper waits for
    each), and their measured queue wait is at least the time they were seen queued before the gate opened."""
    key, gate = new_gate()
    client = make_client(toy_entry("gated", "Gated", kwargs={"gate": key}, max_batch_size=1), worker_threads=1)

    def predict(x: torch.Tensor) -> Any:
        return client.post("/predict", json={"model": "gated", "inputs": [tensor_input(row) for row in x]})

    before = scrape(client)
    held = queued_behind_hold(
        client, "gated", gate, partial(predict, hold_rows()), [partial(predict, torch.ones(1, WIDTH))] * 3
    )
    after = scrape(client)
    assert [r.status_code for r in held.answers] == [200] * 3
    assert value(after, "hookserve_queue_depth", model="gated") == 0
    waits = "hookserve_job_queue_seconds"
    assert (
        value(after, f"{waits}_count", model="gated", kind="predict")
        - value(before, f"{waits}_count", model="gated", kind="predict")
        == 4
    )
    waited = value(after, f"{waits}_sum", model="gated", kind="predict") - value(
        before, f"{waits}_sum", model="gated", kind="predict"
    )
    assert held.least_wait() > 0
    assert waited >= held.least_wait()


def test_hook_jobs_are_timed_as_exclusive(client: TestClient) -> None:
    count = "hookserve_job_compute_seconds_count"
    before = value(scrape(client), count, model="lenet", kind="exclusive")
    body = {"model": "lenet", "inputs": lenet_inputs(1), "layers": ["conv1"], "format": "stats"}
    assert client.post("/activations", json=body).status_code == 200
    after = scrape(client)
    assert value(after, count, model="lenet", kind="exclusive") == before + 1
    assert value(after, "hookserve_job_queue_seconds_count", model="lenet", kind="exclusive") >= 1


def test_hooked_batches_have_their_own_size_histogram(client: TestClient) -> None:
    """A hooked request's inputs count as one hooked batch; a summary (a hook job without inputs) and a
    prediction do not move it."""
    hooked, predicted = "hookserve_hooked_batch_size", "hookserve_batch_size"
    before = scrape(client)
    body = {"model": "lenet", "inputs": lenet_inputs(3), "layers": ["conv1", "conv2"], "format": "stats"}
    assert client.post("/activations", json=body).status_code == 200
    assert client.get("/models/lenet/summary").status_code == 200
    after = scrape(client)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, model="lenet", **labels) - value(before, name, model="lenet", **labels)

    assert delta(f"{hooked}_count") == 1
    assert delta(f"{hooked}_sum") == 3
    assert delta(f"{hooked}_bucket", le="2.0") == 0
    assert delta(f"{hooked}_bucket", le="4.0") == 1
    assert delta(f"{predicted}_count") == 0
    assert client.post("/predict", json={"model": "lenet", "inputs": lenet_inputs(2)}).status_code == 200
    assert value(scrape(client), f"{hooked}_count", model="lenet") == value(after, f"{hooked}_count", model="lenet")


def test_requests_are_labelled_by_route_template_and_model(client: TestClient) -> None:
    before = scrape(client)
    assert client.get("/models/lenet").status_code == 200
    assert client.get("/models/no-such-model").status_code == 404
    assert client.get("/no/such/path").status_code == 404
    after = scrape(client)

    def delta(**labels: str) -> float:
        return value(after, "hookserve_requests_total", **labels) - value(before, "hookserve_requests_total", **labels)

    assert delta(route="/models/{name}", method="GET", model="lenet", status="200") == 1
    assert delta(route="/models/{name}", method="GET", model="", status="404") == 1  # unknown names are no label
    assert delta(route="<unmatched>", method="GET", model="", status="404") == 1
    label_values = {v for _, labels in after for _, v in labels}
    assert "no-such-model" not in label_values
    assert "/models/lenet" not in label_values
    assert "/no/such/path" not in label_values


def test_openmetrics_when_asked(client: TestClient) -> None:
    response = client.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/openmetrics-text")
    names = {family.name for family in parse_openmetrics(response.text)}  # type: ignore[no-untyped-call]
    assert {"hookserve_requests", "hookserve_model_state", "hookserve_batch_size"} <= names


def test_each_app_has_its_own_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "models.toml"
    config.write_text(
        '[[models]]\nname = "tiny"\nsource = "python"\narchitecture = "service.zoo.lenet:LeNet"\n'
        "input_size = [3, 32, 32]\n\n"
        '[[models]]\nname = "broken"\nsource = "python"\narchitecture = "service.zoo.lenet:LeNet"\n'
        'weights = "missing.pt"\n'
    )
    settings = Settings(model_dir=tmp_path, config=config, worker_threads=1)
    with observed_client(settings) as c:
        wait_settled(c)
        c.get("/models/tiny")
        samples = scrape(c)
    assert value(samples, "hookserve_model_state", model="tiny", state="ready") == 1.0
    assert value(samples, "hookserve_model_state", model="broken", state="failed") == 1.0
    assert value(samples, "hookserve_model_state", model="broken", state="ready") == 0.0
    assert ("hookserve_model_load_seconds", frozenset({("model", "broken")})) not in samples
    assert (
        value(samples, "hookserve_requests_total", route="/models/{name}", method="GET", model="tiny", status="200")
        == 1
    )
    assert not any(labels >= {("model", "lenet")} for _, labels in samples)  # nothing from the other app
    assert not any(f.name.startswith("hookserve") for f in prometheus_client.REGISTRY.collect())


def test_an_unloaded_model_takes_its_batch_series_with_it(tmp_path: Path) -> None:
    config = tmp_path / "models.toml"
    config.write_text(
        '[[models]]\nname = "tiny"\nsource = "python"\narchitecture = "service.zoo.lenet:LeNet"\n'
        "input_size = [3, 32, 32]\n"
    )
    settings = Settings(model_dir=tmp_path, config=config, worker_threads=1, admin_token="t")
    with observed_client(settings) as c:
        wait_settled(c)
        assert c.post("/predict", json={"model": "tiny", "inputs": lenet_inputs(1)}).status_code == 200
        body = {"model": "tiny", "inputs": lenet_inputs(1), "layers": ["conv1"], "format": "stats"}
        assert c.post("/activations", json=body).status_code == 200
        assert value(scrape(c), "hookserve_batch_size_count", model="tiny") == 1
        assert value(scrape(c), "hookserve_hooked_batch_size_count", model="tiny") == 1
        assert c.delete("/models/tiny", headers={"Authorization": "Bearer t"}).status_code == 200
        samples = scrape(c)
    assert not any(
        ("model", "tiny") in labels
        for name, labels in samples
        if name.startswith(("hookserve_batch", "hookserve_hooked_batch", "hookserve_job"))
    )


def test_install_is_idempotent(tmp_path: Path) -> None:
    settings = Settings(model_dir=tmp_path, config=None)
    app = create_app(settings)
    first = install_observability(app, settings)
    assert install_observability(app, settings) is first
    assert sum(getattr(m, "cls", None) is ObservabilityMiddleware for m in app.user_middleware) == 1
    assert TestClient(app).get("/healthz").status_code == 200  # no lifespan needed
    labels = {"route": "/healthz", "method": "GET", "model": "", "status": "200"}
    assert first.registry.get_sample_value("hookserve_requests_total", labels) == 1.0
    assert "/metrics" in app.openapi()["paths"]
    job_observer(app)(JobRecord("m", JobKind.predict, 5, (0.002, 0.001), 0.25))
    job_observer(app)(JobRecord("m", JobKind.exclusive, 0, (0.0,), 0.5))
    get = first.registry.get_sample_value
    assert get("hookserve_batch_size_sum", {"model": "m"}) == 5.0  # only prediction batches have a size
    assert get("hookserve_hooked_batch_size_count", {"model": "m"}) is None  # an exclusive job without inputs
    assert get("hookserve_job_queue_seconds_count", {"model": "m", "kind": "predict"}) == 2.0  # one per job
    assert get("hookserve_job_queue_seconds_sum", {"model": "m", "kind": "predict"}) == pytest.approx(0.003)
    assert get("hookserve_job_compute_seconds_count", {"model": "m", "kind": "predict"}) == 1.0  # one per batch
    assert get("hookserve_job_compute_seconds_sum", {"model": "m", "kind": "exclusive"}) == 0.5
    assert metrics_of(app) is first


def test_device_memory_gauges_per_cuda_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda i: 1000 + i)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda i: 4096 * (i + 1))
    families = {f.name: {s.labels["device"]: s.value for s in f.samples} for f in device_memory_families()}
    assert families == {
        "hookserve_device_memory_allocated_bytes": {"cuda:0": 1000.0, "cuda:1": 1001.0},
        "hookserve_device_memory_reserved_bytes": {"cuda:0": 4096.0, "cuda:1": 8192.0},
    }
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert device_memory_families() == []


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_memory_on_a_real_gpu() -> None:
    x = torch.ones(1024, 1024, device="cuda:0")  # 4 MiB
    families = {f.name: f.samples[0].value for f in device_memory_families()}
    assert families["hookserve_device_memory_allocated_bytes"] >= x.numel() * 4
    assert families["hookserve_device_memory_reserved_bytes"] >= families["hookserve_device_memory_allocated_bytes"]
