"""/interventions/sweep runs its ablated rows in forwards that fit max_request_memory_bytes: with a small limit
it answers in more, smaller forwards, and the same numbers as with the default limit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import ClientFactory, tensor_input
from tests.conftest import write_lenet as lenet_entry

KIB = 1024


def test_a_sweep_runs_in_chunks_that_fit_and_answers_the_same(make_client: ClientFactory, tmp_path: Path) -> None:
    inputs = [tensor_input(t) for t in torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))]
    body = {"model": "lenet", "inputs": inputs, "site": "conv2", "channels": [0, 16], "target": 3}
    roomy = make_client(lenet_entry(tmp_path))
    small = make_client(lenet_entry(tmp_path), max_request_memory_bytes=160 * KIB)
    planned = small.post("/interventions/sweep", json={**body, "dry_run": True}).json()
    default = roomy.post("/interventions/sweep", json={**body, "dry_run": True}).json()
    assert planned["admitted"] is True
    assert planned["memory"]["bytes"] <= 160 * KIB
    assert 2 <= planned["rows_per_forward"] < default["rows_per_forward"]
    want = roomy.post("/interventions/sweep", json=body)
    got = small.post("/interventions/sweep", json=body)
    assert got.status_code == want.status_code == 200, got.text
    expected = {c["channel"]: c["deltas"] for c in want.json()["channels"]}
    for channel in got.json()["channels"]:
        assert channel["deltas"] == pytest.approx(expected[channel["channel"]], abs=1e-5)


def test_a_sweep_whose_one_row_per_input_does_not_fit_names_the_inputs(
    make_client: ClientFactory, tmp_path: Path
) -> None:
    client = make_client(lenet_entry(tmp_path), max_request_memory_bytes=40 * KIB)
    inputs = [tensor_input(t) for t in torch.rand(4, 3, 32, 32, generator=torch.Generator().manual_seed(1))]
    response = client.post("/interventions/sweep", json={"model": "lenet", "inputs": inputs, "site": "conv2"})
    assert response.status_code == 413, response.text
    assert "fewer or smaller inputs" in response.json()["detail"]
