"""Attention rollout, gradient-weighted attention and Grad-CAM / layer methods at token layers, through /saliency on
the shipped digits ViT, against implementations written here from the papers (and from pytorch-grad-cam's
`reshape_transform` recipe) on timm's own attention maps."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from fastapi.testclient import TestClient
from torch import Tensor

from tests.conftest import as_tensor, b64, sample_png, tensor_input
from tests.helpers.vit import timm_attention, unfused, vit_inputs

GRID = (8, 8)


def vit(client: TestClient) -> torch.nn.Module:
    return client.app.state.hookserve.fleet.ready("vit_digits").model.module  # type: ignore[attr-defined,no-any-return]


def saliency(client: TestClient, x: Tensor, **fields: Any) -> list[dict[str, Any]]:
    body = {"model": "vit_digits", "inputs": [tensor_input(row) for row in x], **fields}
    r = client.post("/saliency", json=body)
    assert r.status_code == 200, r.text
    results: list[dict[str, Any]] = r.json()["results"]
    return results


def rollout_by_hand(maps: list[np.ndarray], fusion: str, ratio: float) -> np.ndarray:
    """Abnar & Zuidema's rollout of one sample's maps `[heads, T, T]`, the lowest weights discarded first."""
    tokens = maps[0].shape[-1]
    total = np.eye(tokens)
    for block in maps:
        fused = {"mean": block.mean(0), "max": block.max(0), "min": block.min(0)}[fusion].astype(np.float64)
        flat = fused.ravel().copy()
        lowest = np.argsort(flat, kind="stable")[: int(flat.size * ratio)]
        flat[lowest[lowest != 0]] = 0.0
        mixed = 0.5 * flat.reshape(fused.shape) + 0.5 * np.eye(tokens)
        total = (mixed / mixed.sum(axis=1, keepdims=True)) @ total
    return total[0, 1:].reshape(GRID)


@pytest.mark.parametrize(("fusion", "ratio"), [("mean", 0.0), ("max", 0.9), ("min", 0.3)])
def test_rollout_equals_the_paper_on_timm_maps(builtin_client: TestClient, fusion: str, ratio: float) -> None:
    x = vit_inputs(2, seed=11)
    maps = timm_attention(vit(builtin_client), x)
    results = saliency(builtin_client, x, method="attention_rollout", head_fusion=fusion, discard_ratio=ratio)
    for i, result in enumerate(results):
        want = rollout_by_hand([m[i].double().numpy() for m in maps.values()], fusion, ratio)
        got = as_tensor(result["attribution"]).double().numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
        assert result["tokens"] == {"count": 65, "prefix": ["cls"], "grid": [8, 8], "patch_size": [4, 4]}
        heat = as_tensor(result["heatmap"])
        assert heat.shape == (32, 32)
        assert float(heat.min()) == 0.0
        assert float(heat.max()) == 1.0


def chefer_by_hand(model: torch.nn.Module, x: Tensor, targets: list[int]) -> Tensor:
    """Chefer et al.'s relevance, with the attention maps' gradients read through `retain_grad` on a copy."""
    twin = unfused(model)
    maps: list[Tensor] = []

    def keep(module: torch.nn.Module, args: Any, output: Tensor) -> None:
        output.retain_grad()
        maps.append(output)

    handles = [block.attn.attn_drop.register_forward_hook(keep) for block in twin.blocks]  # type: ignore[union-attr]
    try:
        logits = twin(x)
        logits[torch.arange(len(targets)), targets].sum().backward()
    finally:
        for handle in handles:
            handle.remove()
    out = []
    for i in range(x.shape[0]):
        relevance = torch.eye(65, dtype=torch.float64)
        for a in maps:
            assert a.grad is not None
            cam = (a.grad[i] * a[i]).detach().double().clamp(min=0).mean(0)
            relevance = relevance + cam @ relevance
        out.append(relevance[0, 1:].reshape(GRID))
    return torch.stack(out)


def test_gradient_weighted_attention_equals_chefer_by_hand(builtin_client: TestClient) -> None:
    x = vit_inputs(3, seed=12)
    targets = [7, 1, 4]
    results = saliency(builtin_client, x, method="gradient_weighted_attention", target=targets)
    want = chefer_by_hand(vit(builtin_client), x, targets)
    for result, expected in zip(results, want, strict=True):
        torch.testing.assert_close(as_tensor(result["attribution"]).double(), expected, rtol=1e-5, atol=1e-7)
    other = saliency(builtin_client, x[:1], method="gradient_weighted_attention", target=2)[0]["attribution"]
    assert not torch.allclose(as_tensor(other), as_tensor(results[0]["attribution"]))  # it depends on the target


def token_gradcam_by_hand(model: torch.nn.Module, x: Tensor, layer: str, targets: list[int]) -> Tensor:
    """pytorch-grad-cam's recipe for ViTs: hook the layer, drop the class token, reshape the rest to the grid."""
    kept: dict[str, Tensor] = {}

    def keep(module: torch.nn.Module, args: Any, output: Tensor) -> None:
        output.retain_grad()
        kept["act"] = output

    handle = model.get_submodule(layer).register_forward_hook(keep)
    try:
        logits = model(x.clone())
        logits[torch.arange(len(targets)), targets].sum().backward()
    finally:
        handle.remove()
    act, grad = kept["act"], kept["act"].grad
    assert grad is not None

    def reshape_transform(t: Tensor) -> Tensor:
        return t[:, 1:, :].reshape(t.shape[0], *GRID, t.shape[2]).permute(0, 3, 1, 2)

    act, grad = reshape_transform(act.detach()), reshape_transform(grad)
    return F.relu((grad.mean(dim=(2, 3), keepdim=True) * act).sum(dim=1))


def test_gradcam_reads_a_token_layer_as_its_patch_grid(builtin_client: TestClient) -> None:
    x = vit_inputs(2, seed=13)
    results = saliency(builtin_client, x, method="gradcam", layer="blocks.3.norm1", target=[3, 8])
    want = token_gradcam_by_hand(copy.deepcopy(vit(builtin_client)), x, "blocks.3.norm1", [3, 8])
    for result, expected in zip(results, want, strict=True):
        torch.testing.assert_close(as_tensor(result["attribution"]), expected, rtol=1e-5, atol=1e-6)
        assert result["tokens"]["prefix"] == ["cls"]  # dropped, and named
        assert as_tensor(result["heatmap"]).shape == (32, 32)


def test_layer_methods_draw_token_layers_on_the_grid(builtin_client: TestClient) -> None:
    x = vit_inputs(1, seed=14)
    result = saliency(builtin_client, x, method="layer_integrated_gradients", layer="blocks.1", steps=4)[0]
    attribution = as_tensor(result["attribution"])
    assert attribution.shape == (65, 64)  # Captum's attribution in the layer's own shape
    grid = attribution[1:].T.reshape(64, *GRID).abs().amax(dim=0)
    want = F.interpolate(grid[None, None], size=(32, 32), mode="bilinear", align_corners=False)[0, 0]
    want = (want - want.min()) / (want.max() - want.min())
    torch.testing.assert_close(as_tensor(result["heatmap"]), want, rtol=1e-5, atol=1e-6)
    assert result["tokens"]["grid"] == [8, 8]
    guided = saliency(builtin_client, x, method="guided_gradcam", layer="blocks.3.norm1")[0]
    assert as_tensor(guided["attribution"]).shape == (3, 32, 32)
    assert guided["tokens"]["prefix"] == ["cls"]


def test_a_png_of_rollout_over_the_digit(builtin_client: TestClient) -> None:
    body = {"model": "vit_digits", "inputs": [{"image": b64(sample_png(7))}], "method": "attention_rollout"}
    r = builtin_client.post("/saliency", json=body | {"format": "png"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "image/png"
    assert builtin_client.get("/models/vit_digits").json()["hooks"] == 0


@pytest.mark.parametrize(
    ("model", "method", "words"),
    [
        ("lenet", "attention_rollout", "lenet has no attention modules"),
        ("efficientvit_b0", "gradient_weighted_attention", "LiteMLA"),
    ],
)
def test_models_without_readable_attention_are_refused_before_any_work(
    builtin_client: TestClient, model: str, method: str, words: str
) -> None:
    body = {"model": model, "inputs": [{"image": b64(sample_png(1))}], "method": method}
    r = builtin_client.post("/saliency", json=body)
    assert r.status_code == 422, r.text
    assert words in r.json()["detail"]
