"""The methods beyond the first five equal Captum called directly: attributions, heatmaps, convergence deltas.

Models: a tiny CNN with in-place ReLUs, the shipped LeNet (whose shared `relu` and `pool` DeepLift
refuses) and its unshared twin, and a seeded resnet18 at 64×64.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from captum.attr import DeepLift, FeatureAblation, Occlusion
from skimage.segmentation import slic
from torch import Tensor, nn
from torchvision.models import resnet18

from service.config import Settings
from service.errors import InvalidField
from service.introspection.attribution import SaliencyItem, compute_saliency, method_named
from service.introspection.hooks import count_hooks
from service.zoo.lenet import load_lenet
from tests.helpers.captum_reference import (
    CAPTUM_HOOK_NOTICE,
    LAYER_METHODS,
    NEW_METHODS,
    WITH_DELTAS,
    captum,
    expected_heatmap,
    grad_input,
    method_params,
    minmax,
)
from tests.helpers.unshared_lenet import unshared_lenet
from tests.unit.introspection.test_saliency import TinyCNN

TARGETS = [1, 3]
SETTINGS = Settings(ig_internal_batch_size=64, perturbation_batch_size=8)


def tiny() -> tuple[nn.Module, Tensor, str, list[int]]:
    torch.manual_seed(0)
    return TinyCNN().eval(), torch.rand(2, 3, 8, 8), "features", [4, 3, 5]


def lenet() -> tuple[nn.Module, Tensor, str, list[int]]:
    return load_lenet(), torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1)), "conv2", [7, 4, 6]


def unshared() -> tuple[nn.Module, Tensor, str, list[int]]:
    return unshared_lenet(), lenet()[1], "conv2", [7, 4, 6]


def resnet() -> tuple[nn.Module, Tensor, str, list[int]]:
    torch.manual_seed(0)
    return resnet18(weights=None).eval(), torch.rand(2, 3, 64, 64), "layer4.1.conv2", [300, 1, 0]


MODELS: dict[str, Callable[[], tuple[nn.Module, Tensor, str, list[int]]]] = {
    "tiny": tiny,
    "lenet": lenet,
    "unshared_lenet": unshared,
    "resnet18": resnet,
}


def saliency(model: nn.Module, x: Tensor, method: str, settings: Settings = SETTINGS, **kw: Any) -> list[SaliencyItem]:
    return compute_saliency(model, x, method_named(method).params(**kw), TARGETS, settings=settings)


REFUSED = {("deeplift", "lenet"), ("deeplift", "resnet18")}  # shared activation modules (see test_deeplift_refuses)
CASES = [
    (model, method)
    for model in MODELS
    for method in NEW_METHODS
    if (method, model) not in REFUSED and (model != "unshared_lenet" or method == "deeplift")
]


@pytest.mark.filterwarnings(CAPTUM_HOOK_NOTICE)
@pytest.mark.parametrize(("model_name", "method"), CASES)
def test_equals_captum(model_name: str, method: str) -> None:
    model, x, layer, neuron = MODELS[model_name]()
    p = method_params(method, model_name == "tiny", layer, neuron)
    items = saliency(model, x, method, **p)
    assert count_hooks(model) == 0
    expected, deltas = captum(model, x, method, p, TARGETS)
    logits = model(x).detach()
    for i, item in enumerate(items):
        assert item.target == TARGETS[i]
        assert item.score == pytest.approx(float(logits[i, TARGETS[i]]), rel=1e-5)
        want = expected[i].detach()
        assert item.attribution.shape == want.shape
        scale = float(want.abs().max()) + 1e-12
        torch.testing.assert_close(item.attribution, want, rtol=1e-3, atol=1e-5 * scale)
        torch.testing.assert_close(item.heatmap, expected_heatmap(want, x, method in LAYER_METHODS), atol=2e-4, rtol=0)
        if method in WITH_DELTAS:
            assert deltas is not None
            assert item.convergence_delta == pytest.approx(float(deltas[i]), rel=1e-3, abs=1e-5)
        else:
            assert item.convergence_delta is None
    assert count_hooks(model) == 0
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("model_name", ["lenet", "resnet18"])
def test_deeplift_refuses_models_that_reuse_an_activation_module(model_name: str) -> None:
    """Captum's DeepLift fails in the backward on a module called twice; the request is refused before it runs."""
    model, x, _, _ = MODELS[model_name]()
    needle = "'relu' runs 4 times" if model_name == "lenet" else "'layer1.0.relu' runs 2 times"
    with pytest.raises(InvalidField, match=needle):
        saliency(model, x, "deeplift")
    assert count_hooks(model) == 0
    assert not [name for name, m in model.named_modules() if "input" in vars(m) or "output" in vars(m)]


@pytest.mark.filterwarnings(CAPTUM_HOOK_NOTICE)
def test_what_captum_would_do_on_a_reused_module() -> None:
    """Why the refusal above: Captum itself raises, and leaves tensors on the model's modules."""
    model = load_lenet()
    with pytest.raises(RuntimeError, match="used more than once"):
        DeepLift(model).attribute(grad_input(lenet()[1]), target=TARGETS)
    assert "input" in vars(model.pool)


def test_feature_ablation_superpixels_equal_captum_over_slic_segments() -> None:
    model, x, _, _ = resnet()
    x = x[:, :, :48, :48]
    items = saliency(model, x, "feature_ablation", segments=12, compactness=0.5, sigma=1.0, baseline=0.0)
    for i, item in enumerate(items):
        image = x[i].permute(1, 2, 0).double().numpy()
        labels = slic(image, n_segments=12, compactness=0.5, sigma=1.0, channel_axis=-1, convert2lab=False)
        mask = torch.from_numpy(np.unique(labels, return_inverse=True)[1].reshape(labels.shape))[None, None]
        assert 4 <= int(mask.max()) + 1 <= 24
        want = FeatureAblation(model).attribute(x[i : i + 1], baselines=0.0, target=TARGETS[i], feature_mask=mask)[0]
        torch.testing.assert_close(item.attribution, want, rtol=1e-3, atol=1e-5 * float(want.abs().max()))
        for segment in range(int(mask.max()) + 1):  # one value per superpixel (and channel)
            inside = item.attribution[:, mask[0, 0] == segment]
            assert torch.equal(inside, inside[:, :1].expand_as(inside))


def test_occlusion_default_strides_are_half_the_window_and_leading_dims_go_together() -> None:
    model, x, _, _ = tiny()
    items = saliency(model, x, "occlusion", window=[4, 4])
    want = Occlusion(model).attribute(x, (3, 4, 4), strides=(1, 2, 2), baselines=0.0, target=TARGETS)
    for item, expected in zip(items, want, strict=True):
        torch.testing.assert_close(item.attribution, expected, rtol=1e-4, atol=1e-6)
    per_channel = saliency(model, x, "occlusion", window=[1, 4, 4], strides=[1, 4, 4])
    want = Occlusion(model).attribute(x, (1, 4, 4), strides=(1, 4, 4), baselines=0.0, target=TARGETS)
    for item, expected in zip(per_channel, want, strict=True):
        torch.testing.assert_close(item.attribution, expected, rtol=1e-4, atol=1e-6)
    assert not torch.equal(per_channel[0].attribution[0], per_channel[0].attribution[1])


@pytest.mark.parametrize(
    ("method", "layer", "needle"),
    [
        ("layer_conductance", "relu", "'relu' runs 4 times per forward"),
        ("layer_integrated_gradients", "pool", "'pool' runs 2 times per forward"),
        ("neuron_gradient", "relu", "'relu' runs 4 times per forward"),
        ("guided_gradcam", "pool", "'pool' runs 2 times per forward"),
        ("guided_gradcam", "fc1", "guided_gradcam needs a layer with a spatial output"),
    ],
)
def test_layer_methods_need_a_layer_that_runs_once(method: str, layer: str, needle: str) -> None:
    model, x, _, _ = lenet()
    extra: dict[str, Any] = {"neuron": [0]} if method == "neuron_gradient" else {}
    with pytest.raises(InvalidField, match=needle):
        saliency(model, x, method, layer=layer, **extra)
    assert count_hooks(model) == 0


def test_layer_integrated_gradients_refuses_a_layer_modified_in_place_downstream() -> None:
    """ResNet's bn1 output goes through an in-place ReLU: Captum's replacement of it would fail in autograd."""
    model, x, _, _ = resnet()
    with pytest.raises(InvalidField, match=r"'layer1\.0\.bn1' is modified in place"):
        saliency(model, x, "layer_integrated_gradients", layer="layer1.0.bn1", steps=2)
    items = saliency(model, x, "layer_conductance", layer="layer1.0.bn1", steps=2)  # Captum clones: fine there
    assert items[0].attribution.shape == (64, 16, 16)


@pytest.mark.parametrize(
    ("neuron", "ok"),
    [([15, 9, 9], True), ([16, 0, 0], False), ([0, 10, 0], False), ([3], False), ([1, 2, 3, 4], False)],
)
def test_neuron_index_must_be_one_unit_of_the_layer(neuron: list[int], ok: bool) -> None:
    model, x, _, _ = lenet()
    if ok:
        assert len(saliency(model, x, "neuron_gradient", layer="conv2", neuron=neuron)) == 2
        return
    with pytest.raises(InvalidField, match=r"whose output is \[16, 10, 10\] per input; give 3 indices"):
        saliency(model, x, "neuron_gradient", layer="conv2", neuron=neuron)


def test_layer_methods_default_to_the_last_conv() -> None:
    model, x, _, _ = lenet()
    cases: list[tuple[str, dict[str, Any]]] = [
        ("layer_conductance", {"steps": 4}),
        ("layer_integrated_gradients", {"steps": 4}),
        ("neuron_gradient", {"neuron": [2, 3, 4]}),
        ("guided_gradcam", {}),
    ]
    for method, extra in cases:
        default = saliency(model, x, method, **extra)
        named = saliency(model, x, method, layer="conv2", **extra)
        for a, b in zip(default, named, strict=True):
            assert torch.equal(a.attribution, b.attribution), method
    fc_only = nn.Sequential(nn.Flatten(), nn.Linear(12, 5)).eval()
    no_layer: list[tuple[str, dict[str, Any]]] = [
        ("layer_conductance", {"steps": 2}),
        ("neuron_gradient", {"neuron": [0]}),
    ]
    for method, extra in no_layer:
        with pytest.raises(InvalidField, match=f"^{method} needs a layer: this model has no Conv2d"):
            saliency(fc_only, torch.rand(2, 3, 2, 2), method, **extra)


def test_a_layer_without_spatial_dims_keeps_its_units_in_the_heatmap() -> None:
    model, x, _, _ = lenet()
    items = saliency(model, x, "layer_conductance", layer="fc1", steps=4)
    assert items[0].attribution.shape == (120,)
    assert items[0].heatmap.shape == (1, 120)
    torch.testing.assert_close(items[0].heatmap[0], minmax(items[0].attribution.abs()))
