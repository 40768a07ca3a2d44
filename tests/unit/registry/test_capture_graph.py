"""Capture plans built directly: the hooks' keys for tuple outputs, several and keyword arguments, nested layers and
in-place ops; the refusals, each with its kind."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from service.introspection.capture import capture_by_layer
from service.introspection.hooks import count_hooks
from service.introspection.tensor_stats import reduce_tensor
from service.registry.capture_graph import PlanKey, PlanRefused, build_plan
from service.specs.vocab import Capture, Reduce


class Split(nn.Module):
    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return x[:, :2], x[:, 2:]


class Pair(nn.Module):
    def forward(self, a: Tensor, b: Tensor, *, scale: Tensor) -> Tensor:
        return torch.cat([a.relu(), b.sigmoid()], dim=1) * scale


class Toy(nn.Module):
    """A tuple output, two positional and one keyword tensor, a reused in-place ReLU and a never-called layer."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.split = Split()
        self.pair = Pair()
        self.relu = nn.ReLU(inplace=True)
        self.fc = nn.Linear(4, 3)
        self.unused = nn.Linear(4, 4)

    def forward(self, x: Tensor) -> Tensor:
        a, b = self.split(self.relu(self.conv(x)))
        y = self.relu(self.pair(a, b, scale=x[:, :1]))
        y += 1.0  # in place on the second ReLU's output: the plan must keep what the hook saw
        out: Tensor = self.fc(y.mean((2, 3)))
        return out


class Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        if x.sum() > 0:
            x = -x
        out: Tensor = self.fc(x)
        return out


def key(layers: list[str], capture: Capture, shape: tuple[int, ...] = (4, 6, 6)) -> PlanKey:
    return PlanKey.of(layers, capture, shape)


@pytest.mark.parametrize("capture", list(Capture))
def test_a_plan_answers_with_the_hooks_keys_and_values(capture: Capture) -> None:
    model = Toy().eval()
    layers = ["split", "pair", "relu", "conv"]
    plan = build_plan(model, key(layers, capture), channels_last=False, wide_threads=1)
    x = torch.randn(5, 4, 6, 6, generator=torch.Generator().manual_seed(7))  # neither probe's batch
    with torch.inference_mode():
        want_output, want, want_keys = capture_by_layer(model, layers, capture, lambda: model(x))
        output, got, got_keys = plan.capture(x)
    assert list(got) == list(want)
    assert got_keys == want_keys
    if capture is not Capture.output:
        assert {"split", "pair.0", "pair.1", "pair.scale", "relu#2"} <= set(got)
    for name, sides in want.items():
        assert sorted(got[name]) == sorted(sides)
        for side, t in sides.items():
            torch.testing.assert_close(got[name][side], t, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(output, want_output, rtol=1e-4, atol=1e-4)
    assert count_hooks(model) == 0


@pytest.mark.parametrize(
    ("model", "layers", "kind"),
    [(Branchy(), ["fc"], "untraceable"), (Toy(), ["unused"], "unsupported"), (Toy(), [""], "unsupported")],
)
def test_refusals_say_why(model: nn.Module, layers: list[str], kind: str) -> None:
    shape = (4,) if isinstance(model, Branchy) else (4, 6, 6)
    with pytest.raises(PlanRefused) as refused:
        build_plan(model.eval(), key(layers, Capture.output, shape), channels_last=False, wide_threads=1)
    assert refused.value.kind == kind
    assert refused.value.reason


@pytest.mark.parametrize("reduce", [Reduce.mean, Reduce.max])
def test_a_reducing_plan_hands_over_each_capture_reduced_inside_its_graph(reduce: Reduce) -> None:
    model = Toy().eval()
    layers = ["conv", "relu", "fc"]
    plan = build_plan(model, PlanKey.of(layers, Capture.both, (4, 6, 6), reduce=reduce), False, wide_threads=1)
    x = torch.randn(5, 4, 6, 6, generator=torch.Generator().manual_seed(8))
    with torch.inference_mode():
        _, want, _ = capture_by_layer(model, layers, Capture.both, lambda: model(x))
        _, got, _ = plan.capture(x)
    assert list(got) == list(want)
    for name, sides in want.items():
        for side, t in sides.items():
            assert got[name][side].shape == t.shape[:2]  # [N, C]: the maps never leave ONNX Runtime
            torch.testing.assert_close(got[name][side], reduce_tensor(t, reduce), rtol=1e-4, atol=1e-4)


def test_flatten_is_no_reduction_of_a_plan() -> None:
    assert PlanKey.of(["conv"], Capture.output, (4, 6, 6), reduce=Reduce.flatten).reduce is None
