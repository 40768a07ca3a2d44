"""A request that cannot finish before its deadline is refused at once (422) with its estimate in forwards and
seconds and the parameter that lowers it, instead of running until a 504. The model's measured times per row
are replaced by known ones here, so the refusals are deterministic (no timing is asserted)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.registry.row_times import RowTimes
from tests.conftest import ClientFactory
from tests.reliability.test_admission import gate_client, gate_of, x

PER_ROW = RowTimes(forward=0.01, backward=0.02)  # seconds; the deadline below is 1 s


@pytest.fixture
def client(make_client: ClientFactory, tmp_path: Path) -> Any:
    client = gate_client(make_client, tmp_path, request_timeout_s=1.0)
    client.app.state.hookserve.fleet.ready("gate").model.row_times = PER_ROW
    return client


def post(client: TestClient, path: str, **body: Any) -> Any:
    return client.post(path, json={"model": "gate", "inputs": x(n=2), **body})


@pytest.mark.parametrize(
    ("body", "advice"),
    [
        ({"method": "occlusion", "window": [4, 4], "strides": [2, 2]}, "larger window or larger strides"),
        ({"method": "integrated_gradients", "steps": 64}, "lower steps"),
        ({"method": "smoothgrad", "samples": 40}, "lower samples"),
    ],
)
def test_a_saliency_request_past_its_deadline_is_refused_before_any_forward(
    client: TestClient, body: dict[str, Any], advice: str
) -> None:
    gate = gate_of(client)
    before = gate.forwards
    response = post(client, "/saliency", **body)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert "forwards" in detail
    assert " s, over the 1 s deadline (request_timeout_s)" in detail
    assert advice in detail
    assert gate.forwards == before


def test_the_refusal_names_a_setting_that_would_finish_in_time(client: TestClient) -> None:
    """Occlusion 2x2 (strides 1) on 32x32 is 961 positions: 2 x 963 rows at 0.01 s; 8x8 with strides 4 is 49
    positions, 2 x 51 rows = 1.02 s, still over; 16x16 with strides 8 is 9, 2 x 11 rows = 0.22 s."""
    response = post(client, "/saliency", method="occlusion", window=[2, 2], strides=[1, 1])
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert "1,926 forwards ≈ 19.3 s, over the 1 s deadline" in detail
    assert "(window 16,16 with strides 8,8 is 22 forwards ≈ 0.22 s)" in detail
    steps = post(client, "/saliency", method="integrated_gradients", steps=64).json()["detail"]
    # steps 16: 2 x 19 rows, 32 with a backward = 1.02 s, still over; steps 8: 22 rows, 16 backwards = 0.54 s
    assert "lower steps (steps 8 is 22 forwards (16 with a backward) ≈ 0.54 s)" in steps


def test_the_estimate_counts_rows_and_their_backwards(client: TestClient) -> None:
    """Occlusion 8x8 with strides 8 on 32x32: 16 positions + the input + the class scores, per input."""
    occlusion = post(client, "/saliency", method="occlusion", window=[8, 8], strides=[8, 8], dry_run=True).json()
    assert occlusion["forwards"] == 36
    assert occlusion["seconds"] == pytest.approx(36 * 0.01)
    integrated = post(client, "/saliency", method="integrated_gradients", steps=10, dry_run=True).json()
    assert integrated["seconds"] == pytest.approx((2 * 13) * 0.01 + (2 * 10) * 0.02)


def test_a_request_within_its_deadline_runs(client: TestClient) -> None:
    response = post(client, "/saliency", method="occlusion", window=[8, 8], strides=[8, 8])
    assert response.status_code == 200, response.text


def test_a_sweep_past_its_deadline_names_its_range(client: TestClient) -> None:
    response = post(client, "/interventions/sweep", site="conv", channels=[0, 64])
    assert response.status_code == 422, response.text
    assert "sweep a smaller range" in response.json()["detail"]


def test_times_scale_with_the_input_size(client: TestClient) -> None:
    """Measured at 32x32; a 64x64 input is four times the work per row."""
    small = post(client, "/predict", dry_run=True).json()["seconds"]
    large = client.post("/predict", json={"model": "gate", "inputs": x(64, 2), "dry_run": True}).json()["seconds"]
    assert large == pytest.approx(4 * small)


def test_estimates_learn_from_what_requests_took(make_client: ClientFactory, tmp_path: Path) -> None:
    """Times per row far slower than the gate really is (0.1 s; its 32x32 forwards take milliseconds): once an
    occlusion has run, the same request is estimated far lower (the load-time measurement is corrected)."""
    client = gate_client(make_client, tmp_path)
    client.app.state.hookserve.fleet.ready("gate").model.row_times = RowTimes(forward=0.1, backward=0.1)
    body = {"method": "occlusion", "window": [8, 8], "strides": [8, 8]}
    before = post(client, "/saliency", dry_run=True, **body).json()["seconds"]
    assert before == pytest.approx(36 * 0.1)
    assert post(client, "/saliency", **body).status_code == 200
    after = post(client, "/saliency", dry_run=True, **body).json()["seconds"]
    assert after < before / 2


def test_rows_per_forward_are_bounded_by_chunk_seconds(make_client: ClientFactory, tmp_path: Path) -> None:
    """At 0.1 s a row forward and 0.1 s its backward, a forward of IG's rows takes 1 s (chunk_seconds) at 5
    rows; a sweep's forwards (no backward) at 10: a request given up on stops within about a second."""
    client = gate_client(make_client, tmp_path)
    client.app.state.hookserve.fleet.ready("gate").model.row_times = RowTimes(forward=0.1, backward=0.1)
    integrated = post(client, "/saliency", method="integrated_gradients", steps=50, dry_run=True).json()
    assert integrated["rows_per_forward"] == 5
    sweep = post(client, "/interventions/sweep", site="conv", channels=[0, 64], dry_run=True).json()
    assert sweep["rows_per_forward"] == 10
