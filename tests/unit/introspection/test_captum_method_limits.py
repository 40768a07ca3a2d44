"""The newer methods' parameters, limits, memory bounds, seeding and clean-up (their parity: test_captum_methods.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from captum.attr import FeatureAblation, Occlusion
from pydantic import ValidationError
from torch import Tensor, nn

from service.config import Settings
from service.errors import InvalidField
from service.introspection.attribution import SaliencyItem, compute_saliency, method_named
from service.introspection.attribution.run import attribute_batch
from service.introspection.hooks import count_hooks
from tests.unit.introspection.test_saliency import BatchSizes, FailsInBackward, TinyCNN, _Boom, tiny

TARGETS = [1, 3]


def saliency(
    model: nn.Module, x: Tensor, method: str, settings: Settings | None = None, **kw: Any
) -> list[SaliencyItem]:
    params = method_named(method).params(**kw)
    return compute_saliency(model, x, params, TARGETS[: x.shape[0]], settings=settings or Settings())


@pytest.mark.parametrize(
    ("method", "fields", "needle"),
    [
        ("occlusion", {"window": []}, "at least 1 item"),
        ("occlusion", {"window": [0, 4]}, "greater than or equal to 1"),
        ("occlusion", {"window": [4, 4], "strides": [2]}, "strides has 1 entries; give one per window dim (2)"),
        ("occlusion", {"baseline": float("nan")}, "finite number"),
        ("feature_ablation", {"segments": 0}, "greater than or equal to 1"),
        ("feature_ablation", {"compactness": 0}, "greater than 0"),
        ("feature_ablation", {"cell": [4, 4]}, "cell apply to groups=grid"),
        ("feature_ablation", {"groups": "grid", "segments": 8}, "segments apply to groups=slic"),
        ("feature_ablation", {"groups": "voronoi"}, "'slic' or 'grid'"),
        ("guided_gradcam", {"upsampling": "linear"}, "'nearest', 'bilinear', 'bicubic' or 'area'"),
        ("deeplift", {"baseline": float("inf")}, "finite number"),
        ("gradient_shap", {"samples": 0}, "greater than or equal to 1"),
        ("gradient_shap", {"baselines": []}, "at least 1 item"),
        ("gradient_shap", {"baselines": [0.0] * 17}, "at most 16 items"),
        ("gradient_shap", {"seed": 2**32}, "less than or equal to 4294967295"),
        ("gradient_shap", {"noise": -0.1}, "greater than or equal to 0"),
        ("layer_conductance", {"steps": 0}, "greater than or equal to 1"),
        ("layer_integrated_gradients", {"steps": 0}, "greater than or equal to 1"),
        ("neuron_gradient", {}, "neuron\n  Field required"),
        ("neuron_gradient", {"neuron": [-1]}, "greater than or equal to 0"),
        ("guided_backprop", {"layer": "conv1"}, "Extra inputs are not permitted"),
    ],
)
def test_parameters_out_of_their_range_are_refused_by_their_schema(
    method: str, fields: dict[str, Any], needle: str
) -> None:
    with pytest.raises(ValidationError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        method_named(method).params.model_validate(fields)


LIMITS = Settings(
    max_occlusion_windows=10,
    max_ablation_features=12,
    max_gradient_shap_samples=4,
    max_conductance_steps=8,
    max_ig_steps=8,
)


@pytest.mark.parametrize(
    ("method", "fields", "needle"),
    [
        ("feature_ablation", {"segments": 13}, "segments 13 is over the limit of 12 (max_ablation_features)"),
        ("gradient_shap", {"samples": 5}, "samples 5 is over the limit of 4 (max_gradient_shap_samples)"),
        ("layer_conductance", {"steps": 9}, "steps 9 is over the limit of 8 (max_conductance_steps)"),
        ("layer_integrated_gradients", {"steps": 9}, "steps 9 is over the limit of 8 (max_ig_steps)"),
    ],
)
def test_costs_over_a_limit_are_refused_before_any_work(method: str, fields: dict[str, Any], needle: str) -> None:
    chosen = method_named(method)
    params = chosen.params.model_validate(fields)
    with pytest.raises(InvalidField, match=needle.replace("(", r"\(").replace(")", r"\)")):
        chosen.check_limits(params, LIMITS)
    at_limit = {key: value - 1 for key, value in fields.items()}
    chosen.check_limits(chosen.params.model_validate(at_limit), LIMITS)


class Forwards(nn.Module):
    """Counts the forwards a wrapped model runs (a plain attribute: no hook to remove)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.calls = 0

    def forward(self, x: Tensor) -> Tensor:
        self.calls += 1
        out: Tensor = self.model(x)
        return out


@pytest.mark.parametrize(
    ("method", "fields", "needle"),
    [
        ("occlusion", {"window": [2, 2], "strides": [2, 2]}, "16 window positions per input is over the limit of 10"),
        ("occlusion", {"window": [9, 2]}, r"window \[9, 2\] does not fit in the input's last dims \[8, 8\]"),
        ("occlusion", {"window": [1, 1, 2, 2]}, r"window \[1, 1, 2, 2\] has more dims than the input \[3, 8, 8\]"),
        ("occlusion", {"window": [2, 2], "strides": [3, 2]}, r"stride 3 in window dim 0 is larger than the window"),
        ("feature_ablation", {"groups": "grid", "cell": [2, 2]}, "16 grid cells per input is over the limit of 12"),
        ("feature_ablation", {"groups": "grid", "cell": [9, 1]}, r"cell \[9, 1\] is larger than the input's last"),
        ("feature_ablation", {"groups": "grid", "cell": [1, 1, 2, 2]}, r"cell \[1, 1, 2, 2\] has more dims than"),
    ],
)
def test_costs_and_shapes_that_depend_on_the_input_are_refused_before_any_forward(
    method: str, fields: dict[str, Any], needle: str
) -> None:
    model, x = tiny()
    counted = Forwards(model)
    with pytest.raises(InvalidField, match=needle):
        saliency(counted, x, method, LIMITS, **fields)
    assert counted.calls == 0
    limit = "max_occlusion_windows" if method == "occlusion" else "max_ablation_features"
    if "over the limit" in needle:
        with pytest.raises(InvalidField, match=limit):
            saliency(counted, x, method, LIMITS, **fields)


def test_occlusion_at_its_limit_runs_exactly_that_many_windows() -> None:
    model, x = tiny()
    counted = Forwards(model)
    settings = Settings(max_occlusion_windows=9, perturbation_batch_size=1)
    saliency(counted, x[:1], "occlusion", settings, window=[4, 4], strides=[2, 2])
    assert counted.calls == 1 + 1 + 9  # the scores, Captum's unperturbed forward, one per window


def test_superpixels_need_an_image_and_count_against_the_limit() -> None:
    vector = nn.Sequential(nn.Linear(10, 5)).eval()
    with pytest.raises(InvalidField, match=r"slic segments images \[C, H, W\], and the inputs are \[10\]"):
        saliency(vector, torch.rand(2, 10), "feature_ablation")
    model, x = tiny()
    counted = Forwards(model)
    limit = Settings(max_ablation_features=8)
    ablation = method_named("feature_ablation")
    ablation.check_limits(ablation.params.model_validate({"segments": 8}), limit)  # at the limit: allowed
    with pytest.raises(InvalidField, match=r"slic made 9 superpixels of input 0, over the limit of 8"):
        saliency(counted, x, "feature_ablation", limit, segments=8)  # SLIC's grid may hold more than asked
    assert counted.calls == 1  # the scores only: no ablation ran
    x[1, 0, 0, 0] = float("nan")
    with pytest.raises(InvalidField, match="slic segments finite images, and input 1 has NaN or inf"):
        saliency(model, x, "feature_ablation")


def test_perturbations_go_through_the_model_in_bounded_batches() -> None:
    model, x = tiny()
    cases: list[tuple[str, dict[str, Any]]] = [
        ("occlusion", {"window": [2, 2], "strides": [2, 2]}),
        ("feature_ablation", {"groups": "grid", "cell": [2, 2]}),
    ]
    for method, fields in cases:
        seen = BatchSizes(model)
        saliency(model, x, method, Settings(perturbation_batch_size=5), **fields)
        seen.handle.remove()
        assert seen.sizes[0] == 2  # the scores' forward sees the request's batch
        assert max(seen.sizes[1:]) == 5, method
        assert sum(seen.sizes[1:]) == 2 * (1 + 16)  # each input alone: its unperturbed forward and 16 perturbed


def test_path_methods_bound_each_forward_by_the_internal_batch_size() -> None:
    model, x = tiny()
    x = torch.cat([x, torch.rand(3, 3, 8, 8)])
    targets = [0, 1, 2, 3, 4]
    for method in ("layer_conductance", "layer_integrated_gradients"):
        params = method_named(method).params.model_validate({"layer": "features", "steps": 12})
        seen = BatchSizes(model)
        items = compute_saliency(model, x, params, targets, settings=Settings(ig_internal_batch_size=6))
        seen.handle.remove()
        assert seen.sizes[:2] == [5, 1]  # the scores, then the layer's probe on one row
        assert max(seen.sizes[2:]) <= 6, method
        whole = compute_saliency(model, x, params, targets, settings=Settings(ig_internal_batch_size=128))
        for a, b in zip(items, whole, strict=True):
            torch.testing.assert_close(a.attribution, b.attribution, rtol=1e-4, atol=1e-6)
            assert a.convergence_delta == pytest.approx(b.convergence_delta, abs=1e-5)


def test_gradient_shap_is_seeded_per_input_and_restores_both_generators() -> None:
    model, x = tiny()
    torch.manual_seed(123)
    np.random.seed(123)
    torch_draw, numpy_draw = torch.rand(3), np.random.rand(3)
    torch.manual_seed(123)
    np.random.seed(123)
    one = saliency(model, x, "gradient_shap", samples=5, noise=0.1, seed=1)
    assert torch.equal(torch.rand(3), torch_draw)  # both process-wide generators are left as they were
    assert np.array_equal(np.random.rand(3), numpy_draw)
    again = saliency(model, x, "gradient_shap", samples=5, noise=0.1, seed=1)
    other = saliency(model, x, "gradient_shap", samples=5, noise=0.1, seed=2)
    numpy_only_2 = saliency(model, x, "gradient_shap", samples=5, baselines=[0.0, 2.0], seed=2)  # no torch noise
    numpy_only_3 = saliency(model, x, "gradient_shap", samples=5, baselines=[0.0, 2.0], seed=3)
    for a, b, c in zip(one, again, other, strict=True):
        assert torch.equal(a.attribution, b.attribution)
        assert not torch.allclose(a.attribution, c.attribution)
    assert not torch.allclose(numpy_only_2[0].attribution, numpy_only_3[0].attribution)  # NumPy's draws follow seed
    params = method_named("gradient_shap").params.model_validate({"samples": 5, "noise": 0.1, "seed": 1})
    alone = compute_saliency(model, x[1:], params, TARGETS[1:], settings=Settings())
    assert torch.equal(alone[0].attribution, one[1].attribution)  # independent of the rest of the batch


def test_a_one_dimensional_input_takes_windows_and_cells_over_its_length() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 6), nn.ReLU(), nn.Linear(6, 5)).eval()
    x = torch.rand(2, 10)
    items = saliency(model, x, "occlusion", window=[3], strides=[2], baseline=0.1)
    want = Occlusion(model).attribute(x, (3,), strides=(2,), baselines=0.1, target=TARGETS)
    for item, expected in zip(items, want, strict=True):
        torch.testing.assert_close(item.attribution, expected)
        assert item.heatmap.shape == (1, 10)
    cells = saliency(model, x, "feature_ablation", groups="grid", cell=[4])
    mask = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1, 2, 2]])
    want = FeatureAblation(model).attribute(x, baselines=0.0, target=TARGETS, feature_mask=mask)
    for item, expected in zip(cells, want, strict=True):
        torch.testing.assert_close(item.attribution, expected)


HOOKING: dict[str, dict[str, Any]] = {
    "guided_backprop": {},
    "deconvolution": {},
    "guided_gradcam": {"layer": "net.features"},
    "deeplift": {},
    "gradient_shap": {"samples": 2},
    "layer_conductance": {"layer": "net.features", "steps": 2},
    "layer_integrated_gradients": {"layer": "net.features", "steps": 2},
    "neuron_gradient": {"layer": "net.features", "neuron": [0, 1, 1]},
}


class FailsAtTheInput(nn.Module):
    """TinyCNN whose backward fails at its input: where a neuron's gradient, which skips the output, ends."""

    def __init__(self) -> None:
        super().__init__()
        self.net = TinyCNN()

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.net(_Boom.apply(x))
        return out


@pytest.mark.parametrize("method", list(HOOKING))
def test_hooks_and_captum_attributes_are_removed_when_the_attribution_fails(method: str) -> None:
    torch.manual_seed(0)
    model = (FailsAtTheInput() if method == "neuron_gradient" else FailsInBackward()).eval()
    with pytest.raises(RuntimeError, match="boom"):
        saliency(model, torch.rand(2, 3, 8, 8), method, **HOOKING[method])
    assert count_hooks(model) == 0
    left = [f"{name}.{attr}" for name, m in model.named_modules() for attr in ("input", "output") if attr in vars(m)]
    assert left == []  # DeepLift's per-module tensors, which its backward would have deleted


def test_deeplift_answers_with_convergence_deltas_that_close_the_gap() -> None:
    """DeepLIFT's summation-to-delta: the attributions add up to f(x) - f(baseline), up to the delta."""
    model, x = tiny()
    items = saliency(model, x, "deeplift", baseline=0.2)
    with torch.no_grad():
        gap = model(x)[range(2), TARGETS] - model(torch.full_like(x, 0.2))[range(2), TARGETS]
    for item, expected in zip(items, gap.tolist(), strict=True):
        assert item.convergence_delta is not None
        assert float(item.attribution.sum()) - expected == pytest.approx(item.convergence_delta, abs=1e-5)
        assert abs(item.convergence_delta) < 1e-4  # exact for ReLU networks without max-pooling


def test_deeplift_rows_take_their_own_baselines_in_one_batch() -> None:
    model, x = tiny()
    params = [method_named("deeplift").params.model_validate({"baseline": b}) for b in (0.0, 0.7)]
    both = attribute_batch(model, x, params, lambda logits: TARGETS, Settings())
    for i in range(2):
        alone = compute_saliency(model, x[i : i + 1], params[i], TARGETS[i : i + 1], settings=Settings())
        torch.testing.assert_close(both[i].attribution, alone[0].attribution)
