"""optimizer_metadata and the id -> parameter-name mappings, on real torch.optim state dicts."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from service.introspection.optimizer import optimizer_metadata, param_names_for, param_names_from_state_dict


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))


def _steps(model: nn.Module, optimizer: torch.optim.Optimizer, n: int = 2) -> None:
    x = torch.randn(5, 3, generator=torch.Generator().manual_seed(1))
    for _ in range(n):
        optimizer.zero_grad()
        model(x).square().sum().backward()
        optimizer.step()


def test_sgd_two_groups_in_group_order() -> None:
    model = _model()
    groups: list[dict[str, Any]] = [
        {"params": [*model[2].parameters()], "lr": 0.5},
        {"params": [*model[0].parameters(), *model[1].parameters()]},
    ]
    opt = torch.optim.SGD(groups, lr=0.1, momentum=0.9)
    _steps(model, opt)
    names = param_names_for(model, opt)
    assert names == {0: "2.weight", 1: "2.bias", 2: "0.weight", 3: "0.bias", 4: "1.weight", 5: "1.bias"}
    sd = opt.state_dict()
    got = optimizer_metadata("SGD", sd, names)
    assert got["type"] == "SGD"
    first = got["param_groups"][0]
    assert first["params"] == [0, 1]
    assert first["param_names"] == ["2.weight", "2.bias"]
    assert first["lr"] == 0.5
    assert got["param_groups"][1]["lr"] == 0.1
    for group, raw in zip(got["param_groups"], sd["param_groups"], strict=True):
        assert set(group) == set(raw) | {"param_names"}
        assert {k: v for k, v in group.items() if k != "param_names"} == raw
    assert [s["param"] for s in got["state"]] == [0, 1, 2, 3, 4, 5]
    assert got["state"][2] == {
        "param": 2,
        "param_name": "0.weight",
        "entries": {"momentum_buffer": {"shape": [4, 3], "dtype": "float32"}},
    }


def test_adam_scalars_tuples_and_tensor_hyperparameters() -> None:
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=torch.tensor(0.01), betas=(0.8, 0.9))
    _steps(model, opt, n=3)
    got = optimizer_metadata("Adam", opt.state_dict(), None)
    group = got["param_groups"][0]
    assert group["betas"] == [0.8, 0.9]
    assert isinstance(group["lr"], float)
    assert group["lr"] == torch.tensor(0.01).item()
    assert group["param_names"] is None
    assert group["params"] == list(range(6))
    entries = got["state"][1]["entries"]
    assert entries["step"] == 3.0
    assert isinstance(entries["step"], float)
    assert entries["exp_avg"] == {"shape": [4], "dtype": "float32"}
    assert entries["exp_avg_sq"] == {"shape": [4], "dtype": "float32"}
    assert got["state"][1]["param_name"] is None


def test_state_ids_sorted_and_unknown_names_are_none() -> None:
    state = {
        "state": {3: {"momentum_buffer": torch.zeros(2, 2)}, 1: {"count": 4}},
        "param_groups": [{"lr": float("inf"), "params": [1, 3], "nesterov": False, "extra": None}],
    }
    got = optimizer_metadata(None, state, {1: "a.weight"})
    assert got["type"] is None
    assert got["param_groups"] == [
        {"lr": "inf", "params": [1, 3], "nesterov": False, "extra": None, "param_names": ["a.weight", None]}
    ]
    assert got["state"] == [
        {"param": 1, "param_name": "a.weight", "entries": {"count": 4}},
        {"param": 3, "param_name": None, "entries": {"momentum_buffer": {"shape": [2, 2], "dtype": "float32"}}},
    ]


def test_names_from_a_checkpoint_state_dict() -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sd = model.state_dict()
    expected = dict(enumerate(name for name, _ in model.named_parameters()))
    assert param_names_from_state_dict(opt.state_dict(), sd) == expected
    assert param_names_from_state_dict(opt.state_dict(), list(sd)) == expected  # keys only: name heuristic
    subset = torch.optim.SGD(model[0].parameters(), lr=0.1)
    assert param_names_from_state_dict(subset.state_dict(), sd) is None
    assert param_names_from_state_dict({"param_groups": "junk"}, sd) is None


def test_param_names_for_skips_foreign_parameters() -> None:
    model = _model()
    stranger = nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([stranger, *model[2].parameters()], lr=0.1)
    assert param_names_for(model, opt) == {1: "2.weight", 2: "2.bias"}
