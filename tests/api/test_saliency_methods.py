"""POST /saliency with the newer methods (occlusion ... neuron_gradient) against Captum called directly on the same
models built in-process: numbers and heatmaps, PNG and binary answers, limits and refusals, hooks 0."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from torch import Tensor, nn
from torchvision.models import ResNet

from service.config import Settings
from service.introspection.attribution import method_named
from service.main import create_app
from service.registry.probes import TOLERANCE
from service.zoo.lenet import LeNet
from tests.api.test_saliency import decode_png
from tests.conftest import (
    as_tensor,
    b64,
    digit_pixels,
    hooks,
    read_binary_answer,
    sample_png,
    tensor_input,
    wait_settled,
)
from tests.conftest import write_lenet as lenet_entry
from tests.helpers.captum_reference import (
    CAPTUM_HOOK_NOTICE,
    LAYER_METHODS,
    NEW_METHODS,
    WITH_DELTAS,
    captum,
    expected_heatmap,
    method_params,
)
from tests.helpers.unshared_lenet import unshared_lenet

LIMITS: dict[str, Any] = {
    "max_occlusion_windows": 64,
    "max_ablation_features": 40,
    "max_gradient_shap_samples": 8,
    "max_conductance_steps": 16,
    "max_ig_steps": 16,
}


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory, r18: ResNet) -> Iterator[TestClient]:
    root = tmp_path_factory.mktemp("saliency_methods")
    torch.save(r18.state_dict(), root / "r18.pt")
    lenet_toml = lenet_entry(root, labels="digits.txt")
    unshared_toml = lenet_entry(root, name="lenet_unshared", labels="digits.txt").replace(
        "service.zoo.lenet:LeNet",
        "tests.helpers.unshared_lenet:UnsharedLeNet",  # DeepLift needs its own modules
    )
    resnet_toml = (
        '\n[[models]]\nname = "resnet18"\nsource = "torchvision"\narchitecture = "resnet18"\nweights = "r18.pt"\n'
    )
    (root / "models.toml").write_text(lenet_toml + resnet_toml + unshared_toml)
    settings = Settings(
        model_dir=root,
        config=root / "models.toml",
        device="cpu",
        worker_threads=2,
        torch_threads=1,
        ig_internal_batch_size=16,
        perturbation_batch_size=16,
        **LIMITS,
    )
    with TestClient(create_app(settings)) as c:
        wait_settled(c)
        assert {m["name"]: m["status"] for m in c.get("/models").json()["models"]} == dict.fromkeys(
            ["lenet", "resnet18", "lenet_unshared"], "ready"
        )
        yield c


@pytest.fixture(scope="module")
def references(lenet: LeNet, r18: ResNet) -> dict[str, nn.Module]:
    """The served models, built in-process for Captum."""
    return {"lenet": lenet, "resnet18": r18, "lenet_unshared": unshared_lenet()}


def saliency(client: TestClient, **body: Any) -> dict[str, Any]:
    response = client.post("/saliency", json=body)
    assert response.status_code == 200, response.text[:500]
    out: dict[str, Any] = response.json()
    return out


LAYERS = {
    "lenet": ("conv2", [7, 4, 6]),
    "lenet_unshared": ("conv2", [7, 4, 6]),
    "resnet18": ("layer4.1.conv2", [300, 1, 0]),
}
CASES = [(model, method) for model in ("lenet", "resnet18") for method in NEW_METHODS if method != "deeplift"]
CASES.append(("lenet_unshared", "deeplift"))  # LeNet and ResNet reuse their activation modules: see below


@pytest.mark.filterwarnings(CAPTUM_HOOK_NOTICE)
@pytest.mark.parametrize(("model_name", "method"), CASES)
def test_parity_with_captum(client: TestClient, references: dict[str, nn.Module], model_name: str, method: str) -> None:
    model = references[model_name]
    if model_name == "resnet18":
        x, targets = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(2)), [3, 917]
    else:
        x, targets = torch.stack([digit_pixels(3), digit_pixels(8)]), [3, 5]
    layer, neuron = LAYERS[model_name]
    p = method_params(method, False, layer, neuron)
    out = saliency(client, model=model_name, inputs=[tensor_input(t) for t in x], method=method, target=targets, **p)
    want, deltas = captum(model, x, method, p, targets)
    assert out["method"] == method
    for i, result in enumerate(out["results"]):
        assert result["target"] == targets[i]
        attribution, expected = as_tensor(result["attribution"]), want[i].detach()
        assert list(attribution.shape) == list(expected.shape)
        scale = float(expected.abs().max()) + 1e-12
        # perturbation methods run on the prediction path's copy, whose scores loading keeps within TOLERANCE of the
        # model's: an attribution (a difference of two scores) then agrees within twice that
        atol = 2 * TOLERANCE if method_named(method).plain_forwards else 1e-5 * scale
        torch.testing.assert_close(attribution, expected, rtol=1e-3, atol=atol, msg=f"{method} {i}")
        heatmap = as_tensor(result["heatmap"])
        torch.testing.assert_close(heatmap, expected_heatmap(expected, x, method in LAYER_METHODS), rtol=0, atol=2e-3)
        if method in WITH_DELTAS:
            assert deltas is not None
            np.testing.assert_allclose(result["convergence_delta"], float(deltas[i]), rtol=1e-2, atol=1e-4)
        else:
            assert "convergence_delta" not in result
    assert hooks(client, model_name) == 0


def served(client: TestClient, name: str) -> tuple[nn.Module, ...]:
    """The served module and its hook lanes (where hooked requests run)."""
    modules: tuple[nn.Module, ...] = client.app.state.hookserve.fleet.ready(name).model.hookable_modules  # type: ignore[attr-defined]
    return modules


@pytest.mark.parametrize(
    ("model_name", "needle"),
    [("lenet", "'relu' runs 4 times"), ("resnet18", "'layer1.0.relu' runs 2 times, 'layer1.1.relu' runs 2 times")],
)
def test_deeplift_on_a_model_that_reuses_an_activation_module_is_422(
    client: TestClient, model_name: str, needle: str
) -> None:
    x = digit_pixels(4) if model_name == "lenet" else torch.rand(3, 64, 64)
    response = client.post("/saliency", json={"model": model_name, "inputs": [tensor_input(x)], "method": "deeplift"})
    assert response.status_code == 422, response.text[:500]
    detail = response.json()["detail"]
    assert "Captum's DeepLift keeps one input and output per activation module" in detail
    assert needle in detail
    assert hooks(client, model_name) == 0
    for copy in served(client, model_name):  # DeepLift's per-module attributes were all removed
        assert not [n for n, m in copy.named_modules() if {"input", "output"} & set(vars(m))]


PNG_PARAMS: dict[str, dict[str, Any]] = {
    "occlusion": {"window": [8, 8]},
    "feature_ablation": {"segments": 16},
    "gradient_shap": {"samples": 4},
    "layer_conductance": {"steps": 4},
    "layer_integrated_gradients": {"steps": 4},
    "neuron_gradient": {"neuron": [2, 5, 5]},
}


@pytest.mark.parametrize("method", NEW_METHODS)
def test_png_overlays_each_method_on_an_image(client: TestClient, method: str) -> None:
    model = "lenet_unshared" if method == "deeplift" else "lenet"
    body = {"model": model, "inputs": [{"image": b64(sample_png(5))}], "method": method, "format": "png"}
    png = decode_png(client.post("/saliency", json=body | PNG_PARAMS.get(method, {})))
    assert png.size == (224, 224)
    assert hooks(client, model) == 0


def test_a_layer_without_spatial_dims_answers_its_units_but_no_png(client: TestClient) -> None:
    body = {"model": "lenet", "inputs": [tensor_input(digit_pixels(2))], "method": "layer_conductance", "layer": "fc1"}
    out = saliency(client, **body, steps=4)
    assert out["results"][0]["attribution"]["shape"] == [120]
    assert out["results"][0]["heatmap"]["shape"] == [1, 120]
    response = client.post("/saliency", json=body | {"steps": 4, "format": "png"})
    assert response.status_code == 422, response.text[:500]
    assert "png overlays a map of the input's size [32, 32], and these maps are [1, 120]" in response.json()["detail"]


@pytest.mark.parametrize(("method", "fmt"), [("deeplift", "safetensors"), ("occlusion", "npz")])
def test_binary_formats(client: TestClient, method: str, fmt: str) -> None:
    body = {
        "model": "lenet_unshared",
        "inputs": [tensor_input(digit_pixels(3)), tensor_input(digit_pixels(8))],
        "method": method,
        "target": [3, 8],
        **({"window": [8, 8]} if method == "occlusion" else {}),  # within this module's max_occlusion_windows
    }
    reference = saliency(client, **body)
    response = client.post("/saliency", json=body | {"format": fmt})
    assert response.status_code == 200, response.text[:500]
    assert f'filename="saliency-{method}.{fmt}"' in response.headers["content-disposition"]
    tensors, meta = read_binary_answer(response.content, fmt)
    assert meta["method"] == method
    for i, result in enumerate(reference["results"]):
        assert torch.equal(tensors[f"{i}:attribution"], as_tensor(result.pop("attribution")))
        assert torch.equal(tensors[f"{i}:heatmap"], as_tensor(result.pop("heatmap")))
        assert meta["results"][i] == result  # target, label, score, probability and deeplift's convergence_delta
    assert ("convergence_delta" in meta["results"][0]) == (method == "deeplift")


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"method": "occlusion", "window": [2, 2], "strides": [2, 2]}, "256 window positions per input"),
        ({"method": "occlusion", "window": [2, 2], "strides": [2, 2]}, "(max_occlusion_windows)"),
        ({"method": "occlusion", "window": [40, 4]}, "does not fit in the input's last dims [32, 32]"),
        ({"method": "occlusion", "window": [4, 4], "strides": [8, 8]}, "stride 8 in window dim 0 is larger"),
        ({"method": "feature_ablation", "segments": 41}, "over the limit of 40 (max_ablation_features)"),
        ({"method": "feature_ablation", "groups": "grid", "cell": [4, 4]}, "64 grid cells per input"),
        ({"method": "feature_ablation", "cell": [4, 4]}, "cell apply to groups=grid"),
        ({"method": "gradient_shap", "samples": 9}, "(max_gradient_shap_samples)"),
        ({"method": "gradient_shap", "seed": -1}, "seed"),
        ({"method": "layer_conductance", "steps": 17}, "(max_conductance_steps)"),
        ({"method": "layer_integrated_gradients", "steps": 17}, "(max_ig_steps)"),
        ({"method": "layer_conductance", "layer": "relu", "steps": 4}, "'relu' runs 4 times per forward"),
        ({"method": "layer_integrated_gradients", "layer": "conv*", "steps": 4}, "more than the limit of 1"),
        ({"method": "guided_gradcam", "layer": "fc1"}, "spatial output"),
        ({"method": "guided_gradcam", "upsampling": "linear"}, "upsampling"),
        ({"method": "neuron_gradient"}, "neuron"),
        ({"method": "neuron_gradient", "neuron": [16, 0, 0]}, "not a unit of 'conv2', whose output is [16, 10, 10]"),
        ({"method": "deeplift", "baseline": "zeros"}, "baseline"),
        ({"method": "guided_backprop", "steps": 4}, "'steps' is a parameter of integrated_gradients, layer_cond"),
    ],
)
def test_invalid_fields_and_limits_are_422_and_leave_no_hooks(
    client: TestClient, body: dict[str, Any], needle: str
) -> None:
    inputs = [tensor_input(digit_pixels(0)), tensor_input(digit_pixels(1))]
    response = client.post("/saliency", json={"model": "lenet", "inputs": inputs, **body})
    assert response.status_code == 422, response.text[:500]
    assert needle in str(response.json()["detail"])
    assert hooks(client, "lenet") == 0


def test_costs_over_a_limit_are_refused_before_joining_a_batch(client: TestClient) -> None:
    stats = client.app.state.hookserve.fleet.ready("lenet").executor.stats  # type: ignore[attr-defined]
    before = stats.hooked_batches
    inputs = [tensor_input(digit_pixels(0))]
    for body in (
        {"method": "occlusion", "window": [2, 2], "strides": [2, 2]},
        {"method": "feature_ablation", "groups": "grid", "cell": [2, 2]},
        {"method": "gradient_shap", "samples": 9},
    ):
        assert client.post("/saliency", json={"model": "lenet", "inputs": inputs, **body}).status_code == 422
    assert stats.hooked_batches == before
    saliency(client, model="lenet", inputs=inputs, method="occlusion", window=[8, 8])  # 49 positions: under 64
    assert stats.hooked_batches == before + 1


def test_gradient_shap_is_seeded(client: TestClient) -> None:
    x = torch.stack([digit_pixels(1), digit_pixels(3)])
    body = {"model": "lenet", "method": "gradient_shap", "samples": 4, "noise": 0.1, "baselines": [0.0, -1.0]}

    def maps(inputs: Tensor, seed: int) -> list[Tensor]:
        out = saliency(client, inputs=[tensor_input(t) for t in inputs], seed=seed, target=3, **body)
        return [as_tensor(r["attribution"]) for r in out["results"]]

    first = maps(x[1:], seed=11)[0]
    assert torch.equal(first, maps(x[1:], seed=11)[0])
    assert not torch.allclose(first, maps(x[1:], seed=12)[0], rtol=1e-2, atol=0)
    assert torch.equal(first, maps(x, seed=11)[1])  # an input's map does not depend on the rest of the batch


def test_multipart_forms_take_lists_comma_separated(client: TestClient, references: dict[str, nn.Module]) -> None:
    image = [("image", ("digit.png", sample_png(2), "image/png"))]
    form = {"model": "lenet", "method": "occlusion", "window": "8,8", "strides": "4,8", "baseline": "-0.5"}
    response = client.post("/saliency", data=form | {"target": "2"}, files=image)
    assert response.status_code == 200, response.text[:500]
    x = digit_pixels(2)[None]
    p = {"window": [8, 8], "strides": [4, 8], "baseline": -0.5}
    want, _ = captum(references["lenet"], x, "occlusion", p, [2])
    torch.testing.assert_close(as_tensor(response.json()["results"][0]["attribution"]), want[0], rtol=1e-3, atol=1e-6)
    shap = {"model": "lenet", "method": "gradient_shap", "samples": "4", "baselines": "0,1.5", "format": "png"}
    assert decode_png(client.post("/saliency", data=shap, files=image)).size == (224, 224)


@pytest.mark.parametrize("method", ["guided_gradcam", "layer_conductance", "neuron_gradient"])
def test_a_layer_pattern_that_matches_one_layer_is_that_layer(client: TestClient, method: str) -> None:
    body: dict[str, Any] = {"model": "lenet", "method": method, "inputs": [tensor_input(digit_pixels(2))], "target": 2}
    if method == "neuron_gradient":
        body["neuron"] = [3, 1, 1]
    if method == "layer_conductance":
        body["steps"] = 8
    exact = saliency(client, layer="conv2", **body)["results"][0]
    pattern = saliency(client, layer="conv2*", **body)["results"][0]
    torch.testing.assert_close(as_tensor(pattern["attribution"]), as_tensor(exact["attribution"]))
