"""compute_gradients against gradients computed by hand (hand-split forwards, no hooks)."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.models import resnet18
from torchvision.models.resnet import BasicBlock, ResNet

from service.errors import InvalidField
from service.introspection.capture import capture_activations
from service.introspection.gradients import compute_gradients, find_layer
from service.introspection.hooks import count_hooks
from service.specs.vocab import Capture


class TinyCNN(nn.Module):
    """conv(1→2, 3×3) → ReLU(inplace) → flatten → linear(8→3), with hand-set weights."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3)
        self.relu = nn.ReLU(inplace=True)
        self.fc = nn.Linear(8, 3)
        with torch.no_grad():
            self.conv.weight.copy_(torch.stack([torch.ones(1, 3, 3), -0.5 * torch.ones(1, 3, 3)]))
            self.conv.bias.copy_(torch.tensor([-4.0, 1.0]))  # type: ignore[union-attr]
            self.fc.weight.copy_(torch.arange(24.0).reshape(3, 8) / 4 - 3)
            self.fc.bias.copy_(torch.tensor([0.5, -0.5, 0.0]))

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.fc(torch.flatten(self.relu(self.conv(x)), 1))
        return out


X_TINY = torch.tensor(
    [
        [[[0.0, 1.0, 0.0, 2.0], [1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0], [3.0, 0.0, 0.0, 0.0]]],
        [[[0.5, 0.5, 0.5, 0.5], [0.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.5, 0.5], [0.0, 0.0, 0.0, 0.0]]],
    ]
)


def tiny() -> TinyCNN:
    return TinyCNN().eval()


def test_tiny_conv_gradient_is_fc_row_masked_by_relu() -> None:
    model = tiny()
    result = compute_gradients(model, X_TINY, ["conv", "relu", "fc"], target=[2, 0], labels=None, include_input=True)
    conv_out = model.conv(X_TINY).detach()
    mask = (conv_out > 0).float()
    assert 0 < mask.sum() < mask.numel()  # the ReLU really masks something
    rows = torch.stack([model.fc.weight[2], model.fc.weight[0]]).detach().reshape(2, 2, 2, 2)
    assert torch.equal(result.gradients["conv"], rows * mask)  # not rows: the in-place ReLU did not leak
    assert torch.equal(result.gradients["relu"], rows)
    assert torch.equal(result.gradients["fc"], F.one_hot(torch.tensor([2, 0]), 3).float())
    expected_input = F.conv_transpose2d(rows * mask, model.conv.weight.detach())  # d conv / d x, stride 1
    assert torch.allclose(result.gradients["input"], expected_input, atol=1e-6)
    logits = model(X_TINY).detach()
    assert result.targets == [2, 0]
    assert result.scores == pytest.approx([float(logits[0, 2]), float(logits[1, 0])])
    assert list(result.gradients) == ["conv", "relu", "fc", "input"]


def test_include_input_false_leaves_input_out() -> None:
    result = compute_gradients(tiny(), X_TINY, ["conv"], target=None, labels=None, include_input=False)
    assert list(result.gradients) == ["conv"]


def test_parameters_are_left_alone() -> None:
    model = tiny()
    model.fc.weight.requires_grad_(False)  # a frozen layer stays frozen
    compute_gradients(model, X_TINY, ["conv"], target=1, labels=None, include_input=True)
    assert all(p.grad is None for p in model.parameters())
    assert [p.requires_grad for p in model.parameters()] == [True, True, False, True]


def test_frozen_model_still_gets_layer_gradients() -> None:
    model = tiny().requires_grad_(False)
    result = compute_gradients(model, X_TINY, ["relu"], target=0, labels=None, include_input=False)
    assert torch.equal(result.gradients["relu"], model.fc.weight[0].reshape(1, 2, 2, 2).expand(2, -1, -1, -1))


def test_targets_by_top1_index_and_label() -> None:
    model = tiny()
    logits = model(X_TINY).detach()
    labels = ["zero", "one", "two"]
    top1 = compute_gradients(model, X_TINY, ["fc"], target=None, labels=labels, include_input=False)
    assert top1.targets == logits.argmax(1).tolist()
    by_label = compute_gradients(model, X_TINY, ["fc"], target="one", labels=labels, include_input=False)
    by_index = compute_gradients(model, X_TINY, ["fc"], target=1, labels=labels, include_input=False)
    assert by_label.targets == by_index.targets == [1, 1]
    assert by_label.scores == pytest.approx(logits[:, 1].tolist())
    assert torch.equal(by_label.gradients["fc"], by_index.gradients["fc"])
    with pytest.raises(InvalidField, match="closest labels: 'one'"):
        compute_gradients(model, X_TINY, ["fc"], target="onw", labels=labels, include_input=False)


class Shared(nn.Module):
    """One ReLU called twice and a module with a tuple output."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.act = nn.ReLU()
        self.split = Split()
        self.head = nn.Linear(3, 2)
        with torch.no_grad():
            self.lin.weight.copy_(torch.tensor([[1.0, -1.0, 0.5], [0.0, 2.0, -1.0], [1.0, 1.0, 1.0]]))
            self.lin.bias.zero_()
            self.head.weight.copy_(torch.tensor([[1.0, 2.0, 3.0], [-1.0, 0.5, 0.25]]))
            self.head.bias.zero_()

    def forward(self, x: Tensor) -> Tensor:
        a, b = self.split(self.act(self.lin(x)))
        out: Tensor = self.head(self.act(a) * b)
        return out


class Split(nn.Module):
    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return x - 1.0, 2.0 * x


def test_repeated_calls_and_tuple_outputs_are_named_like_activations() -> None:
    model = Shared().eval()
    x = torch.tensor([[1.0, 0.5, 2.0]])
    result = compute_gradients(model, x, ["act", "split"], target=0, labels=None, include_input=False)
    _, captured = capture_activations(model, ["act", "split"], Capture.output, lambda: model(x))
    assert list(result.gradients) == list(captured) == ["act", "split.0", "split.1", "act#2"]
    # by hand: h = relu(lin x); a = h - 1; b = 2h; out = head(relu(a) * b)
    h = F.relu(model.lin(x)).detach().requires_grad_(True)
    a = (h - 1.0).detach().requires_grad_(True)
    b = (2.0 * h).detach().requires_grad_(True)
    r = F.relu(a).detach().requires_grad_(True)
    score = model.head(r * b)[0, 0]
    grads = torch.autograd.grad(score, [r, b])
    assert torch.equal(result.gradients["act#2"], grads[0])
    assert torch.equal(result.gradients["split.1"], grads[1])
    assert torch.equal(result.gradients["split.0"], grads[0] * (a > 0))


def test_unknown_layer_lists_closest() -> None:
    with pytest.raises(InvalidField, match="closest: 'conv'"):
        compute_gradients(tiny(), X_TINY, ["conc"], target=None, labels=None, include_input=False)


def test_layer_that_does_not_run_is_refused() -> None:
    model = tiny()
    model.add_module("unused", nn.Linear(2, 2))
    with pytest.raises(InvalidField, match="'unused' produced no differentiable tensor"):
        compute_gradients(model, X_TINY, ["unused"], target=None, labels=None, include_input=False)
    assert count_hooks(model) == 0


class Boom(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        raise RuntimeError("boom")


def test_hooks_removed_after_success_and_failure() -> None:
    model = tiny()
    compute_gradients(model, X_TINY, ["conv", "relu"], target=None, labels=None, include_input=True)
    assert count_hooks(model) == 0
    model.fc = Boom()  # type: ignore[assignment]
    with pytest.raises(RuntimeError, match="boom"):
        compute_gradients(model, X_TINY, ["conv", "relu"], target=None, labels=None, include_input=True)
    assert count_hooks(model) == 0
    features = nn.Sequential(nn.Conv2d(1, 2, 3))
    with pytest.raises(InvalidField, match="not class scores"):
        compute_gradients(features, X_TINY, ["0"], target=None, labels=None, include_input=True)
    assert count_hooks(features) == 0


def manual_resnet(model: ResNet, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """ResNet split by hand, out-of-place ReLUs: logits, layer1.0.bn1 output, the ReLU after it, layer4."""
    out = model.maxpool(F.relu(model.bn1(model.conv1(x))))
    block: BasicBlock = model.layer1[0]
    bn1 = block.bn1(block.conv1(out))
    relu = F.relu(bn1)
    y = block.bn2(block.conv2(relu))
    out = F.relu(y + out)
    for blk in [model.layer1[1], *model.layer2, *model.layer3, *model.layer4]:
        identity = out if blk.downsample is None else blk.downsample(out)
        y = blk.bn2(blk.conv2(F.relu(blk.bn1(blk.conv1(out)))))
        out = F.relu(y + identity)
    layer4 = out
    logits = model.fc(torch.flatten(model.avgpool(layer4), 1))
    return logits, bn1, relu, layer4


def test_resnet18_layer4_and_inplace_relu_case() -> None:
    torch.manual_seed(0)
    model = resnet18(weights=None).eval()
    x = torch.randn(2, 3, 64, 64)
    targets = [7, 123]
    labels = [f"class {i}" for i in range(1000)]
    result = compute_gradients(
        model, x, ["layer4", "layer1.0.bn1"], target=["class 7", 123], labels=labels, include_input=True
    )
    xin = x.clone().requires_grad_(True)
    logits, bn1, relu, layer4 = manual_resnet(model, xin)
    assert torch.allclose(logits, model(x), atol=1e-5)
    score = logits[0, targets[0]] + logits[1, targets[1]]
    g_layer4, g_bn1, g_relu, g_input = torch.autograd.grad(score, [layer4, bn1, relu, xin])
    assert result.targets == targets
    assert result.scores == pytest.approx(logits.detach()[[0, 1], targets].tolist(), rel=1e-5)
    assert torch.allclose(result.gradients["layer4"], g_layer4, rtol=1e-5, atol=1e-6)
    assert torch.allclose(result.gradients["layer1.0.bn1"], g_bn1, rtol=1e-5, atol=1e-6)
    assert torch.allclose(result.gradients["input"], g_input, rtol=1e-5, atol=1e-6)
    # without the clone, the in-place ReLU would have given d/d(ReLU output): make sure the test can tell
    assert not torch.allclose(g_bn1, g_relu, atol=1e-4)
    assert count_hooks(model) == 0
    assert all(p.grad is None for p in model.parameters())


def test_resnet18_rows_are_independent() -> None:
    torch.manual_seed(0)
    model = resnet18(weights=None, num_classes=10).eval()
    x = torch.randn(2, 3, 32, 32)
    batch = compute_gradients(model, x, ["layer1.0.bn1"], target=None, labels=None, include_input=False)
    one = compute_gradients(model, x[1:], ["layer1.0.bn1"], target=None, labels=None, include_input=False)
    assert batch.targets[1:] == one.targets
    assert torch.allclose(batch.gradients["layer1.0.bn1"][1:], one.gradients["layer1.0.bn1"], atol=1e-6)


class Recurrent(nn.Module):
    """An LSTM (nested tuple output) feeding a linear head from its last step; h_n and c_n go unused."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(3, 4, batch_first=True)
        self.head = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        out, _ = self.lstm(x)
        logits: Tensor = self.head(out[:, -1])
        return logits


def test_nested_outputs_use_the_activation_keys_and_unused_ones_get_zeros() -> None:
    torch.manual_seed(0)
    model = Recurrent().eval()
    x = torch.randn(2, 5, 3)
    result = compute_gradients(model, x, ["lstm", "head"], target=1, labels=None, include_input=False)
    _, captured = capture_activations(model, ["lstm", "head"], Capture.output, lambda: model(x))
    assert list(result.gradients) == list(captured) == ["lstm.0", "lstm.1.0", "lstm.1.1", "head"]
    expected = torch.zeros(2, 5, 4)
    expected[:, -1] = model.head.weight[1].detach()
    assert torch.equal(result.gradients["lstm.0"], expected)
    assert torch.equal(result.gradients["lstm.1.0"], torch.zeros(1, 2, 4))
    assert torch.equal(result.gradients["lstm.1.1"], torch.zeros(1, 2, 4))


class SplitToDict(nn.Module):
    def forward(self, x: Tensor) -> OrderedDict[str, Tensor]:
        return OrderedDict(a=x * 2.0, b=x * 3.0)


class Dicty(nn.Module):
    """A layer whose output is an OrderedDict: the forward after it still gets an OrderedDict."""

    def __init__(self) -> None:
        super().__init__()
        self.split = SplitToDict()
        self.head = nn.Linear(4, 3)
        self.seen: list[type] = []

    def forward(self, x: Tensor) -> Tensor:
        parts = self.split(x)
        self.seen.append(type(parts))
        out: Tensor = self.head(parts["a"] - parts["b"])
        return out


def test_a_mapping_output_keeps_its_type_and_gets_a_gradient_per_key() -> None:
    torch.manual_seed(0)
    model = Dicty().eval()
    x = torch.randn(2, 4)
    result = compute_gradients(model, x, ["split"], target=1, labels=None, include_input=False)
    assert list(result.gradients) == ["split.a", "split.b"]
    row = model.head.weight[1].detach().expand(2, 4)
    torch.testing.assert_close(result.gradients["split.a"], row)
    torch.testing.assert_close(result.gradients["split.b"], -row)
    assert model.seen[-1] is OrderedDict


def test_unknown_layer_of_a_model_without_submodules_has_no_closest_hint() -> None:
    with pytest.raises(InvalidField) as caught:
        find_layer(nn.Linear(2, 2), "fc")
    assert caught.value.detail == "unknown layer 'fc' (GET /models/{name}/layers lists them)"
