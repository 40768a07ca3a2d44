"""Methods that push many rows through the model run them in chunks that fit max_request_memory_bytes (fewer
rows per forward than their setting) instead of being refused, and their maps still equal Captum's; a request
is refused only when one chunk of the fewest rows does not fit, with advice that changes the estimate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from captum.attr import (
    IntegratedGradients,
    LayerConductance,
    LayerIntegratedGradients,
    NoiseTunnel,
    Occlusion,
    Saliency,
)
from fastapi.testclient import TestClient

from tests.conftest import ClientFactory, as_tensor, tensor_input
from tests.conftest import write_lenet as lenet_entry

KIB = 1024
LIMIT = 512 * KIB  # lenet's graph is ~58 KiB a row: a handful of rows per forward
INPUTS = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))


@pytest.fixture
def small(make_client: ClientFactory, tmp_path: Path) -> TestClient:
    return make_client(lenet_entry(tmp_path), max_request_memory_bytes=LIMIT, max_ig_steps=512)


def saliency(client: TestClient, **body: Any) -> Any:
    response = client.post("/saliency", json={"model": "lenet", "inputs": [tensor_input(t) for t in INPUTS], **body})
    assert response.status_code == 200, response.text
    return response.json()


def captum_reference(model: torch.nn.Module, method: str, targets: list[int], p: dict[str, Any]) -> Any:
    """Captum on the whole batch at once (no internal batching)."""
    x, layer = INPUTS.clone(), model.get_submodule("conv2")
    if method == "integrated_gradients":
        return IntegratedGradients(model).attribute(x, baselines=0, target=targets, n_steps=p["steps"])
    if method == "layer_integrated_gradients":
        return LayerIntegratedGradients(model, layer).attribute(x, baselines=0, target=targets, n_steps=p["steps"])
    if method == "layer_conductance":
        return LayerConductance(model, layer).attribute(x, baselines=0, target=targets, n_steps=p["steps"])
    if method == "occlusion":
        window, strides = (3, *p["window"]), (1, *p["strides"])
        return Occlusion(model).attribute(x, window, strides=strides, baselines=0.0, target=targets)
    assert method == "smoothgrad"
    rows = []
    for i, target in enumerate(targets):
        row = x[i : i + 1]
        stdev = float(p["noise"] * (row.max() - row.min()))
        row.requires_grad_(True)
        torch.manual_seed(p["seed"])
        tunnel = NoiseTunnel(Saliency(model))
        rows.append(tunnel.attribute(row, nt_type="smoothgrad", nt_samples=p["samples"], stdevs=stdev, target=target))
    return torch.cat(rows)


CASES: list[tuple[str, dict[str, Any]]] = [
    ("integrated_gradients", {"steps": 40}),
    ("layer_integrated_gradients", {"layer": "conv2", "steps": 40}),
    ("layer_conductance", {"layer": "conv2", "steps": 40}),
    ("smoothgrad", {"samples": 20, "noise": 0.15, "seed": 3}),
    ("occlusion", {"window": [4, 4], "strides": [2, 2]}),
]


@pytest.mark.parametrize(("method", "params"), CASES, ids=[c[0] for c in CASES])
def test_chunks_within_the_limit_equal_captum(small: TestClient, method: str, params: dict[str, Any]) -> None:
    planned = saliency(small, method=method, dry_run=True, **params)
    assert planned["admitted"] is True
    assert planned["memory"]["bytes"] <= LIMIT
    settings = small.app.state.hookserve.settings  # type: ignore[attr-defined]
    bound = settings.perturbation_batch_size if method == "occlusion" else settings.smoothgrad_batch_size
    bound = min(bound, settings.ig_internal_batch_size)
    assert 1 <= planned["rows_per_forward"] < bound  # several chunks, fewer rows than the setting
    answer = saliency(small, method=method, format="json", **params)
    model = small.app.state.hookserve.fleet.ready("lenet").model.module  # type: ignore[attr-defined]
    targets = [result["target"] for result in answer["results"]]
    want = captum_reference(model, method, targets, params)
    got = torch.stack([as_tensor(result["attribution"]) for result in answer["results"]])
    torch.testing.assert_close(got, want.detach().float(), rtol=1e-4, atol=1e-5)


def test_integrated_gradients_at_its_step_limit_runs_in_chunks(small: TestClient) -> None:
    """512 steps (max_ig_steps) on two inputs is 1,024 rows: once a 413, now chunks of a few rows."""
    planned = saliency(small, method="integrated_gradients", steps=512, dry_run=True)
    assert planned["admitted"] is True
    assert planned["memory"]["bytes"] <= LIMIT
    answer = saliency(small, method="integrated_gradients", steps=512)
    assert len(answer["results"]) == 2
    assert all(abs(result["convergence_delta"]) < 0.05 for result in answer["results"])


def test_a_row_that_does_not_fit_is_refused_naming_what_helps(make_client: ClientFactory, tmp_path: Path) -> None:
    """Below one row's cost no chunking helps: the 413 names inputs, not steps (which no longer change it)."""
    client = make_client(lenet_entry(tmp_path), max_request_memory_bytes=200 * KIB)
    body = {"model": "lenet", "inputs": [tensor_input(t) for t in INPUTS], "method": "integrated_gradients"}
    for steps in (2, 50):
        response = client.post("/saliency", json={**body, "steps": steps})
        assert response.status_code == 413, response.text
        detail = response.json()["detail"]
        assert "max_request_memory_bytes" in detail
        assert "fewer or smaller inputs" in detail
        assert "steps" not in detail
