"""Captum called directly, as each newer /saliency method says it is called: the parity tests' reference."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from captum.attr import (
    Deconvolution,
    DeepLift,
    FeatureAblation,
    GradientShap,
    GuidedBackprop,
    GuidedGradCam,
    LayerConductance,
    LayerIntegratedGradients,
    NeuronGradient,
    Occlusion,
)
from torch import Tensor, nn

CAPTUM_HOOK_NOTICE = "ignore:Setting .*hooks:UserWarning"  # Captum's own notice, when a test calls it directly

NEW_METHODS = [
    "occlusion",
    "feature_ablation",
    "guided_backprop",
    "deconvolution",
    "guided_gradcam",
    "deeplift",
    "gradient_shap",
    "layer_conductance",
    "layer_integrated_gradients",
    "neuron_gradient",
]
LAYER_METHODS = {"layer_conductance", "layer_integrated_gradients"}
WITH_DELTAS = {"deeplift", "layer_conductance", "layer_integrated_gradients"}


def method_params(method: str, small: bool, layer: str, neuron: list[int]) -> dict[str, Any]:
    """Each method's parameters in the parity tests (`small`: an 8×8 input): small windows, few steps and samples,
    values other than the defaults."""
    chosen: dict[str, dict[str, Any]] = {
        "occlusion": {
            "window": [3, 3] if small else [16, 16],
            "strides": [2, 2] if small else [8, 12],
            "baseline": 0.5,
        },
        "feature_ablation": {"groups": "grid", "cell": [3, 4] if small else [12, 16], "baseline": -0.5},
        "guided_gradcam": {"layer": layer, "upsampling": "bilinear"},
        "deeplift": {"baseline": 0.25},
        "gradient_shap": {"samples": 6, "baselines": [0.0, 1.0], "noise": 0.1, "seed": 5},
        "layer_conductance": {"layer": layer, "steps": 6},
        "layer_integrated_gradients": {"layer": layer, "steps": 6},
        "neuron_gradient": {"layer": layer, "neuron": neuron},
    }
    return chosen.get(method, {})


def grad_input(x: Tensor) -> Tensor:
    return x.clone().requires_grad_(True)


def grid(cell: list[int], size: tuple[int, int]) -> Tensor:
    """Captum's feature mask of a grid: cell (row, col) is feature row * columns + col."""
    rows = torch.arange(size[0])[:, None] // cell[0]
    cols = torch.arange(size[1])[None, :] // cell[1]
    return (rows * -(-size[1] // cell[1]) + cols)[None, None]


def captum(
    model: nn.Module, x: Tensor, method: str, p: dict[str, Any], targets: list[int]
) -> tuple[Tensor, Tensor | None]:
    """What each method's docstring says it equals, called on Captum with the same parameters (`p`)."""
    layer = model.get_submodule(p["layer"]) if "layer" in p else None
    if method == "occlusion":
        (wh, ww), (sh, sw) = p["window"], p["strides"]
        window, strides = (x.shape[1], wh, ww), (1, sh, sw)
        occlusion = Occlusion(model)
        return occlusion.attribute(x, window, strides=strides, baselines=p["baseline"], target=targets), None
    if method == "feature_ablation":
        mask = grid(p["cell"], (x.shape[2], x.shape[3]))
        return FeatureAblation(model).attribute(x, baselines=p["baseline"], target=targets, feature_mask=mask), None
    if method == "guided_backprop":
        return GuidedBackprop(model).attribute(grad_input(x), target=targets), None
    if method == "deconvolution":
        return Deconvolution(model).attribute(grad_input(x), target=targets), None
    if method == "guided_gradcam":
        assert layer is not None
        gradcam = GuidedGradCam(model, layer)
        return gradcam.attribute(grad_input(x), target=targets, interpolate_mode=p["upsampling"]), None
    if method == "deeplift":
        baselines = torch.full_like(x, p["baseline"])
        deeplift = DeepLift(model)
        attr, delta = deeplift.attribute(grad_input(x), baselines, target=targets, return_convergence_delta=True)
        return attr, delta
    if method == "gradient_shap":
        rows = []
        for i, t in enumerate(targets):
            row = x[i : i + 1]
            torch.manual_seed(p["seed"])
            np.random.seed(p["seed"])
            baselines = torch.stack([torch.full_like(row[0], v) for v in p["baselines"]])
            stdev = float(p["noise"] * (row.max() - row.min()))
            shap = GradientShap(model)
            rows.append(shap.attribute(grad_input(row), baselines, n_samples=p["samples"], stdevs=stdev, target=t))
        return torch.cat(rows), None
    assert layer is not None
    if method == "layer_conductance":
        conductance = LayerConductance(model, layer)
        attr, delta = conductance.attribute(
            x, baselines=0, target=targets, n_steps=p["steps"], return_convergence_delta=True
        )
        return attr, delta
    if method == "layer_integrated_gradients":
        integrated = LayerIntegratedGradients(model, layer)
        attr, delta = integrated.attribute(
            x, baselines=0, target=targets, n_steps=p["steps"], return_convergence_delta=True
        )
        return attr, delta
    assert method == "neuron_gradient"
    return NeuronGradient(model, layer).attribute(grad_input(x), neuron_selector=tuple(p["neuron"])), None


def minmax(t: Tensor) -> Tensor:
    return (t - t.min()) / (t.max() - t.min()) if t.max() > t.min() else torch.zeros_like(t)


def expected_heatmap(attribution: Tensor, x: Tensor, at_layer: bool) -> Tensor:
    """Max over channels of |a|; at a spatial layer, upsampled bilinearly to the input; min-max scaled."""
    magnitude = attribution.abs().amax(0) if attribution.dim() == 3 else attribution.abs().reshape(1, -1)
    if at_layer and attribution.dim() == 3:
        size = (x.shape[-2], x.shape[-1])
        magnitude = F.interpolate(magnitude[None, None], size=size, mode="bilinear", align_corners=False)[0, 0]
    return minmax(magnitude)
