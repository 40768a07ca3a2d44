"""capture_activations and HookScope: keys, copies at hook time, and no hook left behind."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from service.errors import InvalidField
from service.introspection.capture import capture_activations
from service.introspection.hooks import HookScope, count_hooks
from service.specs.vocab import Capture


class Shared(nn.Module):
    """A conv followed by an in-place ReLU, and one ReLU module applied three times."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(1, 2, 3)
        self.inplace = nn.ReLU(inplace=True)
        self.relu = nn.ReLU()
        self.fc = nn.Linear(2, 2)

    def forward(self, x: Tensor) -> Tensor:
        x = self.inplace(self.conv(x))
        x = self.relu(x - 0.5)
        x = self.relu(x.mean(dim=(2, 3)) - 0.1)
        return torch.as_tensor(self.relu(self.fc(x)))


class Pair(nn.Module):
    def forward(self, a: Tensor, b: Tensor, scale: float = 1.0, mask: Tensor | None = None) -> Any:
        out = (a + b) * scale
        if mask is not None:
            out = out * mask
        return out, "not a tensor", {"neg": -out, "both": (out, out * 2)}


class Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pair = Pair()

    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        first = self.pair(a, b, 2.0)[0]
        return torch.as_tensor(self.pair(first, b, mask=torch.ones_like(b))[0])


def _own_hooks(model: nn.Module, name: str) -> tuple[list[Tensor], list[Tensor], HookScope]:
    """The test's reference: clones of every input/output of `name`, collected by our own hooks."""
    inputs: list[Tensor] = []
    outputs: list[Tensor] = []
    module = model.get_submodule(name)
    scope = HookScope(model)
    scope.add(module.register_forward_pre_hook(lambda m, args: inputs.append(args[0].clone())))
    scope.add(module.register_forward_hook(lambda m, args, out: outputs.append(out.clone())))
    return inputs, outputs, scope


def test_output_is_copied_before_the_inplace_relu() -> None:
    model = Shared().eval()
    x = torch.randn(2, 1, 5, 5, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = nn.functional.conv2d(x, model.conv.weight, model.conv.bias)
    assert (expected < 0).any()  # so the in-place ReLU would change an uncopied capture

    def forward() -> Tensor:
        with torch.inference_mode():
            return torch.as_tensor(model(x))

    out, captured = capture_activations(model, ["conv"], Capture.output, forward)
    assert torch.equal(captured["conv"]["output"], expected)
    assert set(captured) == {"conv"}
    assert out.shape == (2, 2)
    assert count_hooks(model) == 0


def test_shared_module_reports_every_call_in_order() -> None:
    model = Shared().eval()
    x = torch.randn(2, 1, 5, 5, generator=torch.Generator().manual_seed(2))
    ref_in, ref_out, scope = _own_hooks(model, "relu")
    with scope, torch.no_grad():
        expected_logits = model(x)
    assert len(ref_out) == 3

    out, captured = capture_activations(model, ["relu"], Capture.both, lambda: model(x))
    assert list(captured) == ["relu", "relu#2", "relu#3"]
    for key, want_in, want_out in zip(captured, ref_in, ref_out, strict=True):
        assert torch.equal(captured[key]["input"], want_in)
        assert torch.equal(captured[key]["output"], want_out)
    assert torch.equal(out, expected_logits)
    assert count_hooks(model) == 0


def test_input_only_and_output_only() -> None:
    model = Shared().eval()
    x = torch.randn(1, 1, 4, 4)
    _, inputs = capture_activations(model, ["fc"], Capture.input, lambda: model(x))
    _, outputs = capture_activations(model, ["fc"], Capture.output, lambda: model(x))
    _, plain = capture_activations(model, ["fc"], "input", lambda: model(x))  # type: ignore[arg-type]
    assert list(plain["fc"]) == ["input"]
    assert list(inputs["fc"]) == ["input"]
    assert list(outputs["fc"]) == ["output"]
    assert torch.equal(model.fc(inputs["fc"]["input"]), outputs["fc"]["output"])


def test_container_outputs_and_several_inputs() -> None:
    model = Outer()
    a, b = torch.randn(3), torch.randn(3)
    _, got = capture_activations(model, ["pair"], Capture.both, lambda: model(a, b))
    first = (a + b) * 2.0
    second = first + b
    expected_out = {
        "pair.0": first,
        "pair.2.neg": -first,
        "pair.2.both.0": first,
        "pair.2.both.1": first * 2,
        "pair#2.0": second,
        "pair#2.2.neg": -second,
        "pair#2.2.both.0": second,
        "pair#2.2.both.1": second * 2,
    }
    expected_in = {"pair.0": a, "pair.1": b, "pair#2.0": first, "pair#2.1": b, "pair#2.mask": torch.ones(3)}
    assert set(got) == set(expected_out) | set(expected_in)
    for key, want in expected_out.items():
        assert torch.equal(got[key]["output"], want), key
    for key, want in expected_in.items():
        assert torch.equal(got[key]["input"], want), key
    assert "output" not in got["pair.1"]


def test_captures_are_detached_cpu_copies() -> None:
    model = nn.Linear(2, 2)
    x = torch.randn(1, 2)
    _, got = capture_activations(model, [""], Capture.both, lambda: model(x))
    assert got[""]["input"].data_ptr() != x.data_ptr()
    x.add_(1.0)
    assert not torch.equal(got[""]["input"], x)
    assert not got[""]["output"].requires_grad
    assert got[""]["output"].device.type == "cpu"


def test_hooks_removed_when_run_raises() -> None:
    model = Shared()

    def boom() -> None:
        model(torch.randn(1, 1, 4, 4))
        raise RuntimeError("fails after the forward")

    with pytest.raises(RuntimeError, match="fails after"):
        capture_activations(model, ["conv", "relu", "fc"], Capture.both, boom)
    assert count_hooks(model) == 0

    def bad_input() -> Tensor:
        return torch.as_tensor(model(torch.randn(1, 3, 4, 4)))  # wrong channel count

    with pytest.raises(RuntimeError):
        capture_activations(model, ["conv"], Capture.output, bad_input)
    assert count_hooks(model) == 0


def test_unknown_layer() -> None:
    model = Shared()
    with pytest.raises(InvalidField, match="'nope'"):
        capture_activations(model, ["nope"], Capture.output, lambda: None)
    assert count_hooks(model) == 0


def test_unknown_layers_are_all_named_in_the_detail() -> None:
    with pytest.raises(InvalidField) as caught:
        capture_activations(Shared(), ["conv", "nope", "gone"], Capture.output, lambda: None)
    assert caught.value.detail == "unknown layers: 'nope', 'gone'"


def test_concurrent_captures_on_two_models_do_not_mix() -> None:
    models = [nn.Linear(4, 4), nn.Linear(4, 4)]
    inputs = [torch.full((2, 4), 1.0), torch.full((2, 4), -1.0)]
    barrier = threading.Barrier(2)
    results: dict[int, dict[str, dict[str, Tensor]]] = {}

    def work(i: int) -> None:
        def run() -> Tensor:
            barrier.wait(timeout=10)  # both sets of hooks are registered at this point
            return torch.as_tensor(models[i](inputs[i]))

        results[i] = capture_activations(models[i], [""], Capture.both, run)[1]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(2):
        assert torch.equal(results[i][""]["input"], inputs[i])
        with torch.no_grad():
            assert torch.equal(results[i][""]["output"], models[i](inputs[i]))


def test_hook_scope_counts_module_and_tensor_hooks() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    x = torch.randn(1, 2, requires_grad=True)
    with HookScope(model) as scope:
        scope.add(model[0].register_forward_hook(lambda m, a, o: None))
        scope.add(model[0].register_forward_pre_hook(lambda m, a, k: None, with_kwargs=True))
        scope.add(model[1].register_full_backward_hook(lambda m, gi, go: None))
        scope.add(model[1].register_full_backward_pre_hook(lambda m, go: None))
        scope.tensor_hook(x, lambda g: g)
        assert count_hooks(model) == 5
        with HookScope(model) as inner:
            inner.tensor_hook(x, lambda g: None)
            assert count_hooks(model) == 6
        assert count_hooks(model) == 5
    assert count_hooks(model) == 0
    assert not x._backward_hooks


def test_a_scope_tensor_hook_runs_on_the_gradient() -> None:
    x = torch.ones(3, requires_grad=True)
    with HookScope(nn.Linear(2, 2)) as scope:
        scope.tensor_hook(x, lambda g: g * 2)
        (x * 3).sum().backward()  # type: ignore[no-untyped-call]
    assert x.grad is not None
    torch.testing.assert_close(x.grad, torch.full((3,), 6.0))


def test_hook_scope_removes_everything_when_the_body_raises() -> None:
    model = nn.Linear(2, 2)
    x = torch.randn(1, 2, requires_grad=True)

    def body() -> None:
        with HookScope(model) as scope:
            scope.add(model.register_forward_hook(lambda m, a, o: None))
            scope.tensor_hook(x, lambda g: g)
            raise ValueError("body")

    with pytest.raises(ValueError, match="body"):
        body()
    assert count_hooks(model) == 0
    assert not x._backward_hooks
