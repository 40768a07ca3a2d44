"""Contract checks parametrised over every model of the built-in registry."""

from __future__ import annotations

import pytest
import torch
from fastapi.testclient import TestClient

from service.registry.builtin import builtin_specs
from tests.conftest import tensor_input

INFO_KEYS = {
    "name", "source", "architecture", "status", "device", "dtype", "weights", "num_parameters",
    "trainable_parameters", "input_size", "preprocess", "num_classes", "labels", "optimizer", "hooks",
}  # fmt: skip
MODELS = [spec.name for spec in builtin_specs()]


@pytest.fixture(params=MODELS)
def name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _sample(client: TestClient, name: str) -> dict[str, object]:
    size = client.get(f"/models/{name}").json()["input_size"]
    if size[-1] > 64:  # keep the big models cheap: they accept other spatial sizes
        size = [size[0], 64, 64]
    return tensor_input(torch.rand(size, generator=torch.Generator().manual_seed(1)))


def test_info_has_every_field_and_no_hooks(builtin_client: TestClient, name: str) -> None:
    info = builtin_client.get(f"/models/{name}").json()
    assert info.keys() >= INFO_KEYS
    assert info["status"] == "ready"
    assert info["hooks"] == 0
    layers = builtin_client.get(f"/models/{name}/layers").json()["layers"]
    top = [layer["name"] for layer in layers if layer["depth"] == 1]
    assert all(f"({child}): " in info["repr"] for child in top)  # the text of print(model)


def test_layers_root_first_and_children_exist(builtin_client: TestClient, name: str) -> None:
    layers = builtin_client.get(f"/models/{name}/layers").json()["layers"]
    names = {layer["name"] for layer in layers}
    assert (layers[0]["name"], layers[0]["depth"]) == ("", 0)
    assert all(child in names for layer in layers for child in layer["children"])


def test_activations_of_every_top_level_layer_leave_no_hooks(builtin_client: TestClient, name: str) -> None:
    layers = builtin_client.get(f"/models/{name}/layers").json()["layers"]
    top = [layer["name"] for layer in layers if layer["depth"] == 1]
    r = builtin_client.post(
        "/activations",
        json={"model": name, "inputs": [_sample(builtin_client, name)], "layers": top, "format": "stats"},
    )
    assert r.status_code == 200, r.text
    assert {key.split("#")[0].split(".")[0] for key in r.json()["activations"]} <= set(top)
    assert builtin_client.get(f"/models/{name}").json()["hooks"] == 0


def test_predict_answers_or_says_why_not(builtin_client: TestClient, name: str) -> None:
    info = builtin_client.get(f"/models/{name}").json()
    r = builtin_client.post("/predict", json={"model": name, "inputs": [_sample(builtin_client, name)], "top_k": 2})
    if info["num_classes"] is None:
        assert r.status_code == 422
        assert "class scores" in r.json()["detail"]
    else:
        assert r.status_code == 200, r.text
        assert len(r.json()["predictions"][0]["top_k"]) == 2


def test_summary_totals_match_info(builtin_client: TestClient, name: str) -> None:
    info = builtin_client.get(f"/models/{name}").json()
    summary = builtin_client.get(f"/models/{name}/summary", params={"depth": 1})
    assert summary.status_code == 200, summary.text
    assert summary.json()["total_params"] == info["num_parameters"]
    assert builtin_client.get(f"/models/{name}").json()["hooks"] == 0


def test_state_dict_totals_match_parameters(builtin_client: TestClient, name: str) -> None:
    info = builtin_client.get(f"/models/{name}").json()
    body = builtin_client.get(f"/models/{name}/state-dict").json()
    params = sum(e["numel"] for e in body["entries"] if e["kind"] == "parameter")
    assert params == info["num_parameters"]
