"""`dry_run` on every model-running endpoint: 200 with the estimate (memory by part, forwards, seconds, rows per
forward, admission), from JSON and from a multipart form, and nothing runs: the model's forwards and its
statistics do not move."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ClientFactory, sample_png
from tests.conftest import write_lenet as lenet_entry
from tests.reliability.test_admission import MIB, gate_client, gate_of, x

BODIES: list[tuple[str, dict[str, Any]]] = [
    ("/predict", {}),
    ("/activations", {"layers": ["conv"]}),
    ("/gradients", {"layers": ["conv"]}),
    ("/saliency", {"method": "gradcam", "layer": "conv"}),
    ("/saliency", {"method": "integrated_gradients", "steps": 32}),
    ("/saliency", {"method": "occlusion", "window": [8, 8]}),
    ("/interventions", {"edits": [{"site": "conv", "op": "zero", "channels": [0]}]}),
    ("/interventions/sweep", {"site": "conv", "channels": [0, 4]}),
]


def stats(client: Any) -> tuple[int, int]:
    found = client.get("/v2/models/gate/stats").json()["model_stats"][0]
    return found["inference_count"], found["execution_count"]


@pytest.mark.parametrize(("path", "extra"), BODIES, ids=[f"{p}:{e.get('method', '')}" for p, e in BODIES])
def test_a_dry_run_answers_the_estimate_and_runs_nothing(
    make_client: ClientFactory, tmp_path: Path, path: str, extra: dict[str, Any]
) -> None:
    client = gate_client(make_client, tmp_path)
    gate = gate_of(client)
    forwards, counted = gate.forwards, stats(client)
    response = client.post(path, json={"model": "gate", "inputs": x(n=2), "dry_run": True, **extra})
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["dry_run"] is True
    assert answer["admitted"] is True
    assert answer["refusal"] is None
    assert answer["memory"]["bytes"] == sum(answer["memory"]["parts"].values()) > 0
    assert answer["forwards"] >= 2
    assert answer["seconds"] > 0
    assert answer["deadline_s"] == 120.0
    assert gate.forwards == forwards  # no forward ran
    assert stats(client) == counted


def test_a_dry_run_reports_the_work_of_its_method(make_client: ClientFactory, tmp_path: Path) -> None:
    """Occlusion's rows are its window positions (and the input itself); IG's its steps, each with a backward."""
    client = gate_client(make_client, tmp_path)
    body = {"model": "gate", "inputs": x(n=2), "dry_run": True}
    occlusion = client.post("/saliency", json={**body, "method": "occlusion", "window": [8, 8], "strides": [8, 8]})
    assert occlusion.json()["forwards"] == 2 * (16 + 1 + 1)  # 4 x 4 positions, the input, the class scores
    assert occlusion.json()["backwards"] == 0
    integrated = client.post("/saliency", json={**body, "method": "integrated_gradients", "steps": 10}).json()
    assert integrated["backwards"] == 2 * 10


def test_a_dry_run_of_a_request_that_would_be_refused_says_why(make_client: ClientFactory, tmp_path: Path) -> None:
    client = gate_client(make_client, tmp_path, max_request_memory_bytes=4 * MIB)
    big = {"model": "gate", "inputs": x(64, 8), "layers": ["*"], "capture": "both", "format": "safetensors"}
    response = client.post("/activations", json={**big, "dry_run": True})
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["admitted"] is False
    assert answer["refusal"].startswith("413")
    assert "max_request_memory_bytes" in answer["refusal"]
    assert answer["memory"]["bytes"] > answer["memory"]["limit_bytes"] == 4 * MIB
    assert client.post("/activations", json=big).status_code == 413  # as the real request is


def test_a_dry_run_as_a_form_field(make_client: ClientFactory, tmp_path: Path) -> None:
    client = make_client(lenet_entry(tmp_path))
    files = [("image", ("digit_3.png", sample_png(3), "image/png"))]
    response = client.post("/saliency", data={"model": "lenet", "method": "occlusion", "dry_run": "true"}, files=files)
    assert response.status_code == 200, response.text
    assert response.json()["dry_run"] is True
    assert response.json()["forwards"] > 1
    plain = client.post("/predict", data={"model": "lenet", "dry_run": "false"}, files=files)
    assert plain.status_code == 200
    assert "predictions" in plain.json()


def test_invalid_requests_are_refused_before_a_dry_run_too(make_client: ClientFactory, tmp_path: Path) -> None:
    client = gate_client(make_client, tmp_path)
    response = client.post("/activations", json={"model": "gate", "inputs": x(), "layers": ["nope"], "dry_run": True})
    assert response.status_code == 422
