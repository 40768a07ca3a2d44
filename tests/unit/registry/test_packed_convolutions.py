"""Packed convolution weights: when they are used, when torch keeps the call, and that they change no number."""

from __future__ import annotations

import copy
import threading

import pytest
import torch
from torch import nn

from service.registry.packed_convolutions import ConvCall, ConvPacks, packed_convolutions
from service.registry.probes import Placement

PLACEMENT = Placement([3, 32, 32], torch.device("cpu"), torch.float32, True)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, stride=2, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.body = nn.Conv2d(16, 16, 3, padding=1, groups=2)
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn(self.stem(x)))
        x = x + torch.relu(self.body(x))
        return self.head(x.mean((2, 3)))  # type: ignore[no-any-return]


def block() -> Block:
    module = Block().eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            p.uniform_(-0.3, 0.3, generator=generator)
    return module.to(memory_format=torch.channels_last)


def packs_of(module: nn.Module) -> ConvPacks:
    packs, reason = packed_convolutions(module, PLACEMENT)
    assert packs is not None, reason
    return packs


def batch(n: int = 4, size: int = 32) -> torch.Tensor:
    x = torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(n))
    return x.contiguous(memory_format=torch.channels_last)


def assert_same_numbers(module: nn.Module, packs: ConvPacks, x: torch.Tensor) -> None:
    """`module(x)` with the packs is bit-identical to `module(x)` without them (both under inference_mode)."""
    with torch.inference_mode():
        want = module(x)
        with packs.active():
            got = module(x)
    assert torch.equal(got, want)


def packed_block() -> tuple[Block, ConvPacks]:
    module = block()
    return module, packs_of(module)


def test_packed_forwards_are_bit_identical_and_use_the_packs() -> None:
    module, packs = packed_block()
    assert len(packs) == 2
    assert packs.calls == 0  # the load-time check does not count
    assert_same_numbers(module, packs, batch())
    assert packs.calls == 2


def test_a_weight_changed_in_place_is_packed_again() -> None:
    module, packs = packed_block()
    with torch.no_grad():
        module.stem.weight.mul_(-2.0)
    assert_same_numbers(module, packs, batch())
    assert packs.calls == 2


def test_a_model_moved_to_another_dtype_after_packing_runs_on_torch() -> None:
    module, packs = packed_block()
    module.double()
    assert_same_numbers(module, packs, batch().double())
    assert packs.calls == 0


def test_a_weight_made_an_inference_tensor_runs_on_torch() -> None:
    """oneDNN cannot pack an inference tensor: the call goes back to torch instead of raising."""
    module, packs = packed_block()
    with torch.inference_mode():
        module.stem.weight.data = module.stem.weight.data.clone()
    assert module.stem.weight.is_inference()
    assert_same_numbers(module, packs, batch())
    assert packs.calls == 1  # `body` alone


def test_calls_that_record_autograd_stay_with_torch() -> None:
    module, packs = packed_block()
    x = batch().requires_grad_(True)
    with packs.active():
        out = module(x)
    assert out.grad_fn is not None
    assert packs.calls == 0
    (grad,) = torch.autograd.grad(out.sum(), x)
    (want,) = torch.autograd.grad(module(x).sum(), x)
    assert torch.equal(grad, want)


def test_weights_it_did_not_pack_and_nchw_inputs_stay_with_torch() -> None:
    module, packs = packed_block()
    other = torch.randn(16, 3, 3, 3).contiguous(memory_format=torch.channels_last)
    with torch.inference_mode(), packs.active():
        torch.conv2d(batch(), other, None, 2, 1)
    assert packs.calls == 0
    assert_same_numbers(module, packs, batch().contiguous())  # NCHW: oneDNN would answer in NHWC
    assert packs.calls == 1  # `body` alone: torch's stem answers channels_last, as its weight is


def test_shapes_torch_runs_on_another_kernel_stay_with_torch() -> None:
    """torch sends small batch-1 inputs to its own (Slow2d) kernel; a packed call there would change the numbers."""
    module, packs = packed_block()
    assert_same_numbers(module, packs, batch(1, 12))
    assert packs.calls < 2


def test_the_packs_are_active_on_their_thread_alone() -> None:
    module, packs = packed_block()
    entered, release = threading.Event(), threading.Event()

    def hold() -> None:
        with packs.active():
            entered.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    entered.wait(10)
    try:
        with torch.inference_mode():
            module(batch())
    finally:
        release.set()
        holder.join()
    assert packs.calls == 0


def test_packs_that_change_a_number_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    real = ConvPacks.run

    def off_by_a_bit(self: ConvPacks, call: ConvCall) -> torch.Tensor | None:
        out = real(self, call)
        return None if out is None else out + 1e-7

    monkeypatch.setattr(ConvPacks, "run", off_by_a_bit)
    module = block()
    packs, reason = packed_convolutions(module, PLACEMENT)
    assert packs is None
    assert reason == "its outputs on packed weights are not bit-identical to torch's"
    assert not any("_conv_forward" in vars(m) for m in module.modules())  # the refused model is left as it was


@pytest.mark.parametrize(
    ("placement", "module", "reason"),
    [
        (Placement([3, 32, 32], torch.device("cpu"), torch.float32, False), block(), "NCHW"),
        (Placement([3, 32, 32], torch.device("cpu"), torch.float64, True), block().double(), "float64"),
        (Placement([4], torch.device("cpu"), torch.float32, True), nn.Linear(4, 2), "no Conv2d"),
        (PLACEMENT, nn.Sequential(nn.Conv2d(3, 4, 3, padding="same"), nn.Flatten()), "no Conv2d"),
    ],
)
def test_models_it_cannot_pack_say_why(placement: Placement, module: nn.Module, reason: str) -> None:
    packs, why = packed_convolutions(module.eval(), placement)
    assert packs is None
    assert reason in why


def test_a_deep_copy_of_the_module_runs_its_own_convolutions_on_the_packs() -> None:
    """Hook lanes are deep copies made after packing: each routes through its own Conv2d objects (hooks on a
    lane's conv fire for the lane only) and still runs on the packs, with the same numbers."""
    module, packs = packed_block()
    lane = copy.deepcopy(module, memo={id(t): t for t in [*module.parameters(), *module.buffers()]})
    seen: list[str] = []
    lane.body.register_forward_hook(lambda *_: seen.append("lane"))
    module.body.register_forward_hook(lambda *_: seen.append("served"))
    with torch.inference_mode():
        want = module(batch())
        seen.clear()
        with packs.active():
            got = lane(batch())
    assert torch.equal(got, want)
    assert seen == ["lane"]
    assert packs.calls == 2


class Standardized(nn.Conv2d):
    """A conv whose class computes its convolution its own way (weight standardization)."""

    def _conv_forward(self, input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        weight = (weight - weight.mean((1, 2, 3), keepdim=True)) / (weight.std((1, 2, 3), keepdim=True) + 1e-5)
        out: torch.Tensor = super()._conv_forward(input, weight, bias)
        return out


def test_reflect_padding_runs_on_the_packs_and_an_overridden_conv_forward_is_kept() -> None:
    module = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, padding_mode="reflect"), nn.ReLU(), Standardized(8, 8, 3, padding=1)
    )
    module = module.eval().to(memory_format=torch.channels_last)
    packs = packs_of(module)
    calls = packs.calls
    assert_same_numbers(module, packs, batch())
    assert packs.calls == calls + 1  # the reflect-padded conv; Standardized convolves its own weight with torch
    assert "_conv_forward" not in vars(module[2])
