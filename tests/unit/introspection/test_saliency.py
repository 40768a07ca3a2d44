"""compute_saliency equals Captum called directly; seeding, IG completeness and bounds, Grad-CAM, hooks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from captum.attr import InputXGradient, IntegratedGradients, LayerGradCam, NoiseTunnel, Saliency
from pydantic import ValidationError
from torch import Tensor, nn
from torchvision.models import resnet18

from service.config import Settings
from service.errors import InvalidField
from service.introspection.attribution import SaliencyItem, compute_saliency, method_named
from service.introspection.hooks import count_hooks

STEPS, SAMPLES, NOISE, SEED = 16, 8, 0.15, 3
METHODS = [
    "gradient",
    "input_x_gradient",
    "smoothgrad",
    "integrated_gradients",
    "gradcam",
]  # others: test_captum_methods


def saliency(
    model: nn.Module,
    x: Tensor,
    method: str,
    targets: list[int],
    *,
    ig_internal_batch_size: int = 64,
    smoothgrad_batch_size: int = 32,
    **params: Any,
) -> list[SaliencyItem]:
    """`compute_saliency` with `method`'s parameters from keywords, memory bounds as Settings."""
    settings = Settings(ig_internal_batch_size=ig_internal_batch_size, smoothgrad_batch_size=smoothgrad_batch_size)
    return compute_saliency(model, x, method_named(method).params(**params), targets, settings=settings)


PARAMS: dict[str, dict[str, Any]] = {
    "integrated_gradients": {"steps": STEPS},
    "smoothgrad": {"samples": SAMPLES, "noise": NOISE, "seed": SEED},
}


class TinyCNN(nn.Module):
    """Two convs with in-place ReLUs, pooled to 2×2, then 5 classes; seeded weights."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(inplace=True), nn.Conv2d(4, 6, 3, padding=1), nn.ReLU(inplace=True)
        )
        self.pool = nn.AdaptiveAvgPool2d(2)
        self.fc = nn.Linear(24, 5)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.fc(torch.flatten(self.pool(self.features(x)), 1))
        return out


def tiny() -> tuple[nn.Module, Tensor]:
    torch.manual_seed(0)
    return TinyCNN().eval(), torch.rand(2, 3, 8, 8)


def resnet() -> tuple[nn.Module, Tensor]:
    torch.manual_seed(0)
    return resnet18(weights=None).eval(), torch.rand(2, 3, 64, 64)


MODELS: dict[str, Callable[[], tuple[nn.Module, Tensor]]] = {"tiny": tiny, "resnet18": resnet}
TARGETS = [1, 3]


def grad_input(x: Tensor) -> Tensor:
    return x.clone().requires_grad_(True)


def captum_direct(model: nn.Module, x: Tensor, method: str, layer: nn.Module) -> tuple[Tensor, Any]:
    """The API.md formula for each method, called on Captum directly."""
    if method == "gradient":
        return Saliency(model).attribute(grad_input(x), target=TARGETS, abs=True), None
    if method == "input_x_gradient":
        return InputXGradient(model).attribute(grad_input(x), target=TARGETS), None
    if method == "integrated_gradients":
        attr, delta = IntegratedGradients(model).attribute(
            grad_input(x), baselines=0, target=TARGETS, n_steps=STEPS, return_convergence_delta=True
        )
        return attr, delta
    if method == "smoothgrad":
        maps = []
        for i, t in enumerate(TARGETS):
            torch.manual_seed(SEED)
            stdev = float(NOISE * (x[i].max() - x[i].min()))
            maps.append(
                NoiseTunnel(Saliency(model)).attribute(
                    grad_input(x[i : i + 1]), nt_type="smoothgrad", nt_samples=SAMPLES, stdevs=stdev, target=t
                )
            )
        return torch.cat(maps), None
    return LayerGradCam(model, layer).attribute(grad_input(x), target=TARGETS, relu_attributions=True), None


def minmax(t: Tensor) -> Tensor:
    t = t.detach()
    return (t - t.min()) / (t.max() - t.min()) if t.max() > t.min() else torch.zeros_like(t)


@pytest.mark.parametrize("model_name", list(MODELS))
@pytest.mark.parametrize("method", METHODS)
def test_equals_captum(model_name: str, method: str) -> None:
    model, x = MODELS[model_name]()
    layer = model.get_submodule("features.2" if model_name == "tiny" else "layer4.1.conv2")
    items = saliency(model, x, method, TARGETS, **PARAMS.get(method, {}))
    expected, delta = captum_direct(model, x, method, layer)
    logits = model(x).detach()
    assert [item.target for item in items] == TARGETS
    for i, item in enumerate(items):
        assert item.score == pytest.approx(float(logits[i, TARGETS[i]]), rel=1e-5)
        assert item.probability == pytest.approx(float(logits[i].softmax(0)[TARGETS[i]]), rel=1e-5)
        if method == "gradcam":
            assert item.attribution.shape == expected.shape[2:]
            assert torch.allclose(item.attribution, expected[i, 0], rtol=1e-3, atol=1e-6)
            up = F.interpolate(expected[i : i + 1], size=(x.shape[-2:]), mode="bilinear", align_corners=False)[0, 0]
            heat = minmax(up)
        else:
            assert item.attribution.shape == x.shape[1:]
            assert torch.allclose(item.attribution, expected[i], rtol=1e-3, atol=1e-6)
            heat = minmax(expected[i].abs().amax(0))
        assert item.heatmap.shape == x.shape[-2:]
        assert torch.allclose(item.heatmap, heat, atol=1e-4)
        assert float(item.heatmap.min()) == 0.0
        assert float(item.heatmap.max()) == (1.0 if heat.max() > 0 else 0.0)
        if method == "integrated_gradients":
            assert item.convergence_delta == pytest.approx(float(delta[i]), rel=1e-2, abs=1e-4)
        else:
            assert item.convergence_delta is None
    assert count_hooks(model) == 0
    assert all(p.grad is None for p in model.parameters())


def test_gradcam_default_layer_is_the_last_conv_at_its_resolution() -> None:
    model, x = resnet()
    items = saliency(model, x, "gradcam", [5, 5])
    named = saliency(model, x, "gradcam", [5, 5], layer="layer4.1.conv2")
    assert [tuple(item.attribution.shape) for item in items] == [(2, 2), (2, 2)]
    assert torch.equal(items[0].attribution, named[0].attribution)
    shallow = saliency(model, x, "gradcam", [5, 5], layer="layer2")
    assert tuple(shallow[1].attribution.shape) == (8, 8)
    assert tuple(shallow[1].heatmap.shape) == (64, 64)
    assert 0.0 <= float(shallow[1].heatmap.min()) <= float(shallow[1].heatmap.max()) <= 1.0


def test_smoothgrad_is_seeded_and_restores_the_global_rng() -> None:
    model, x = tiny()
    state = torch.get_rng_state()
    one = saliency(model, x, "smoothgrad", TARGETS, samples=SAMPLES, seed=1)
    assert torch.equal(torch.get_rng_state(), state)
    again = saliency(model, x, "smoothgrad", TARGETS, samples=SAMPLES, seed=1)
    other = saliency(model, x, "smoothgrad", TARGETS, samples=SAMPLES, seed=2)
    for a, b, c in zip(one, again, other, strict=True):
        assert torch.equal(a.attribution, b.attribution)
        assert not torch.allclose(a.attribution, c.attribution)
    alone = saliency(model, x[1:], "smoothgrad", TARGETS[1:], samples=SAMPLES, seed=1)
    assert torch.equal(alone[0].attribution, one[1].attribution)  # independent of the rest of the batch


class BatchSizes:
    """A forward-pre hook recording the batch size of every forward (removed by the test)."""

    def __init__(self, model: nn.Module) -> None:
        self.sizes: list[int] = []
        self.handle = model.register_forward_pre_hook(lambda m, args: self.sizes.append(args[0].shape[0]))


def test_integrated_gradients_complete_with_bounded_batches() -> None:
    model, x = tiny()
    x = torch.cat([x, torch.rand(1, 3, 8, 8)])
    targets = [0, 2, 4]
    seen = BatchSizes(model)
    items = saliency(model, x, "integrated_gradients", targets, steps=512, ig_internal_batch_size=16)
    seen.handle.remove()
    assert max(seen.sizes) <= 16
    assert sum(seen.sizes) >= 3 * 512
    with torch.no_grad():
        gap = model(x)[range(3), targets] - model(torch.zeros_like(x))[range(3), targets]
    for item, expected in zip(items, gap.tolist(), strict=True):
        assert float(item.attribution.sum()) == pytest.approx(expected, rel=1e-3, abs=1e-4)
        assert item.convergence_delta is not None
        assert abs(item.convergence_delta) < 1e-3
    seen = BatchSizes(model)  # more inputs than the bound: inputs are chunked too
    chunked = saliency(model, x, "integrated_gradients", targets, steps=8, ig_internal_batch_size=2)
    seen.handle.remove()
    assert seen.sizes[0] == 3  # the scores' forward sees the request's batch
    assert max(seen.sizes[1:]) <= 2
    whole = saliency(model, x, "integrated_gradients", targets, steps=8, ig_internal_batch_size=64)
    for a, b in zip(chunked, whole, strict=True):
        assert torch.allclose(a.attribution, b.attribution, rtol=1e-4, atol=1e-6)


def test_smoothgrad_batch_size_bounds_forwards() -> None:
    model, x = tiny()
    seen = BatchSizes(model)
    saliency(model, x, "smoothgrad", TARGETS, samples=10, smoothgrad_batch_size=4)
    seen.handle.remove()
    assert max(seen.sizes) <= 4


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"method": "gradcam", "layer": "features.9"}, "unknown layer 'features.9'"),
        ({"method": "gradcam", "layer": "fc"}, "gradcam needs a layer with one spatial output"),
        ({"method": "nope"}, "unknown saliency method 'nope'"),
        ({"method": "gradient", "targets": [0, 5]}, "out of range"),
        ({"method": "gradient", "targets": [0]}, "1 targets for 2 inputs"),
    ],
)
def test_invalid_requests_are_422(kwargs: dict[str, Any], message: str) -> None:
    model, x = tiny()
    args: dict[str, Any] = {"targets": TARGETS, **kwargs}
    with pytest.raises(InvalidField, match=message):
        saliency(model, x, args.pop("method"), args.pop("targets"), **args)
    assert count_hooks(model) == 0


class TwoOutputs(nn.Module):
    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return x - 1.0, 2.0 * x


class SplitCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.split = TwoOutputs()
        self.fc = nn.Linear(4, 3)

    def forward(self, x: Tensor) -> Tensor:
        a, b = self.split(self.conv(x))
        out: Tensor = self.fc((a * b).mean((2, 3)))
        return out


def test_gradcam_on_a_layer_with_several_outputs_is_refused() -> None:
    torch.manual_seed(0)
    model = SplitCNN().eval()
    with pytest.raises(InvalidField, match="'split' gives several outputs"):
        saliency(model, torch.rand(2, 3, 8, 8), "gradcam", [0, 2], layer="split")
    assert count_hooks(model) == 0


def test_gradcam_without_any_conv_needs_a_layer() -> None:
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 3)).eval()
    with pytest.raises(InvalidField, match="no Conv2d"):
        saliency(model, torch.rand(1, 3, 2, 2), "gradcam", [0])


def test_model_without_class_scores_is_refused() -> None:
    model = nn.Sequential(nn.Conv2d(3, 2, 3)).eval()
    with pytest.raises(InvalidField, match="not class scores"):
        saliency(model, torch.rand(1, 3, 8, 8), "gradient", [0])


class _Boom(torch.autograd.Function):
    """Identity forward; the backward raises, as a failing kernel would mid-attribution."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        raise RuntimeError("boom")


class FailsInBackward(nn.Module):
    """TinyCNN whose every backward fails, after the attribution's hooks are registered."""

    def __init__(self) -> None:
        super().__init__()
        self.net = TinyCNN()

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = _Boom.apply(self.net(x))
        return out


@pytest.mark.parametrize("method", METHODS)
def test_hooks_removed_when_the_attribution_fails(method: str) -> None:
    torch.manual_seed(0)
    model = FailsInBackward().eval()
    with pytest.raises(RuntimeError, match="boom"):
        saliency(model, torch.rand(2, 3, 8, 8), method, TARGETS, **PARAMS.get(method, {}))
    assert count_hooks(model) == 0


def test_parameters_out_of_their_range_are_refused_by_their_schema() -> None:
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        method_named("integrated_gradients").params.model_validate({"steps": 0})
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        method_named("gradient").params.model_validate({"steps": 4})
