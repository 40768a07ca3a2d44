"""Weights files: bare state dicts, training checkpoints, safetensors; pickles that need code are refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from service.errors import ModelLoadError
from service.registry.loader import load_model
from service.registry.weights import load_into, load_optimizer_state, read_weights, split_checkpoint
from service.specs.model import ModelSpec
from service.zoo.lenet import LeNet


class Payload:
    """Unpickling this calls `open(marker, "w")`: the file appears only if the pickle ran code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return open, (str(self.marker), "w")


def _net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))


def _trained(seed: int) -> tuple[nn.Module, torch.optim.SGD]:
    """A net and an SGD with momentum after two steps (real momentum buffers)."""
    net = _net(seed)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    for _ in range(2):
        optimizer.zero_grad()
        net(torch.ones(5, 3)).square().sum().backward()
        optimizer.step()
    return net, optimizer


def _assert_same_state(got: Any, net: nn.Module) -> None:
    expected = net.state_dict()
    assert list(got) == list(expected)
    for key, value in expected.items():
        assert torch.equal(got[key], value), key


@pytest.mark.parametrize("wrap", [None, "model_state_dict", "state_dict", "model"])
def test_pickled_state_dicts(tmp_path: Path, wrap: str | None) -> None:
    net = _net(1)
    obj: Any = net.state_dict() if wrap is None else {wrap: net.state_dict(), "epoch": 3}
    torch.save(obj, tmp_path / "w.pt")
    weights = read_weights(tmp_path / "w.pt")
    _assert_same_state(weights.model_state, net)
    assert weights.optimizer_state is None


@pytest.mark.parametrize(
    ("model_key", "optimizer_key"), [("model_state_dict", "optimizer_state_dict"), ("model", "optimizer")]
)
def test_training_checkpoint_brings_optimizer_state(tmp_path: Path, model_key: str, optimizer_key: str) -> None:
    net, optimizer = _trained(2)
    torch.save({model_key: net.state_dict(), optimizer_key: optimizer.state_dict(), "epoch": 7}, tmp_path / "c.pt")
    weights = read_weights(tmp_path / "c.pt")
    _assert_same_state(weights.model_state, net)
    assert weights.optimizer_state is not None
    saved = optimizer.state_dict()
    assert weights.optimizer_state["param_groups"] == saved["param_groups"]
    for index, state in saved["state"].items():
        assert torch.equal(weights.optimizer_state["state"][index]["momentum_buffer"], state["momentum_buffer"])


def test_safetensors(tmp_path: Path) -> None:
    net = _net(3)
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(tmp_path / "w.safetensors"))
    weights = read_weights(tmp_path / "w.safetensors")
    assert set(weights.model_state) == set(net.state_dict())
    for key, value in net.state_dict().items():
        assert torch.equal(weights.model_state[key], value)
    assert weights.optimizer_state is None


def test_pickle_that_needs_code_is_refused_and_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    torch.save({"w": Payload(marker)}, tmp_path / "evil.pt")
    with pytest.raises(ModelLoadError, match="refused") as info:
        read_weights(tmp_path / "evil.pt")
    assert "evil.pt" in str(info.value)
    assert str(tmp_path) not in str(info.value)
    assert not marker.exists()
    # the payload is live: an unsafe load would have run it
    loaded = torch.load(tmp_path / "evil.pt", weights_only=False)
    loaded["w"].close()
    assert marker.exists()


@pytest.mark.parametrize(
    ("content", "needle"),
    [(b"", "could not be read"), (b"not a pickle", "could not be read")],
)
def test_garbage_files_fail_cleanly(tmp_path: Path, content: bytes, needle: str) -> None:
    (tmp_path / "bad.pt").write_bytes(content)
    with pytest.raises(ModelLoadError, match=needle):
        read_weights(tmp_path / "bad.pt")


@pytest.mark.parametrize(
    ("obj", "needle"),
    [
        ([1, 2], "holds a list"),
        ({}, "has no state dict"),
        ({"epoch": 3, "state_dict": {"w": 1}}, "has no state dict"),
        ({"model": {}}, "has no state dict"),
    ],
)
def test_split_checkpoint_needs_a_state_dict(obj: Any, needle: str) -> None:
    with pytest.raises(ModelLoadError, match=needle):
        split_checkpoint(obj, "x.pt")


def test_mismatched_weights_name_the_keys() -> None:
    net = _net(4)
    state = dict(net.state_dict())
    del state["2.bias"]
    weights = split_checkpoint(state, "w.pt")
    with pytest.raises(ModelLoadError, match=r"(?s)w\.pt does not match the architecture.*2\.bias"):
        load_into(_net(5), weights, "w.pt")


def test_optimizer_state_that_does_not_fit_is_refused() -> None:
    _, optimizer = _trained(6)
    other = torch.optim.SGD(nn.Linear(3, 1).parameters(), lr=0.1)
    with pytest.raises(ModelLoadError, match="does not fit the optimizer"):
        load_optimizer_state(other, optimizer.state_dict(), "c.pt")


def test_loader_restores_momentum_into_a_default_sgd(tmp_path: Path) -> None:
    """A checkpoint with optimizer state and no [models.optimizer]: an SGD gets the saved state."""
    torch.manual_seed(7)
    net = LeNet()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.001, momentum=0.9)
    optimizer.zero_grad()
    net(torch.randn(2, 3, 32, 32)).sum().backward()
    optimizer.step()
    torch.save(
        {"model_state_dict": net.state_dict(), "optimizer_state_dict": optimizer.state_dict()}, tmp_path / "c.pt"
    )
    spec = ModelSpec.model_validate(
        {"name": "m", "source": "python", "architecture": "service.zoo.lenet:LeNet", "weights": "c.pt"}
        | {"input_size": [3, 32, 32]}
    )
    loaded = load_model(spec, tmp_path, "cpu", allow_downloads=False)
    assert type(loaded.optimizer) is torch.optim.SGD
    group = loaded.optimizer.param_groups[0]
    assert (group["lr"], group["momentum"]) == (0.001, 0.9)
    params = list(loaded.module.parameters())
    for param, expected in zip(params, net.parameters(), strict=True):
        assert torch.equal(param, expected)
        buffer = loaded.optimizer.state[param]["momentum_buffer"]
        assert torch.equal(buffer, optimizer.state[expected]["momentum_buffer"])
