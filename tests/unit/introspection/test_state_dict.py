"""state_dict_entries, checkpoint_state_dict_entries and get_tensor on a small hand-set model."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from service.errors import NotFound
from service.introspection.state_dict import (
    checkpoint_state_dict_entries,
    get_tensor,
    looks_like_buffer,
    state_dict_entries,
)
from service.introspection.tensor_stats import finite_stats


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3)
        self.bn = nn.BatchNorm2d(2)
        self.fc = nn.Linear(2, 3, bias=False)
        self.fc.weight.requires_grad_(False)
        self.register_buffer("scale", torch.tensor([2.0, 3.0], dtype=torch.float64))
        self.register_buffer("scratch", torch.zeros(5), persistent=False)


def test_entries_in_state_dict_order() -> None:
    model = Small()
    got = state_dict_entries(model, stats=False)
    assert [e["key"] for e in got["entries"]] == list(model.state_dict())
    by_key = {e["key"]: e for e in got["entries"]}
    assert by_key["conv.weight"] == {
        "key": "conv.weight",
        "shape": [2, 1, 3, 3],
        "dtype": "float32",
        "numel": 18,
        "bytes": 72,
        "kind": "parameter",
        "requires_grad": True,
    }
    assert by_key["bn.num_batches_tracked"] == {
        "key": "bn.num_batches_tracked",
        "shape": [],
        "dtype": "int64",
        "numel": 1,
        "bytes": 8,
        "kind": "buffer",
        "requires_grad": False,
    }
    assert by_key["fc.weight"]["requires_grad"] is False
    assert by_key["fc.weight"]["kind"] == "parameter"
    assert by_key["scale"]["kind"] == "buffer"
    assert by_key["scale"]["bytes"] == 16
    assert "scratch" not in by_key
    assert got["num_tensors"] == 9
    assert got["total_numel"] == sum(v.numel() for v in model.state_dict().values())
    assert got["total_bytes"] == sum(v.numel() * v.element_size() for v in model.state_dict().values())


def test_tied_weights_appear_under_both_keys_as_parameters() -> None:
    model = nn.Sequential(nn.Linear(2, 2, bias=False), nn.Linear(2, 2, bias=False))
    model[1].weight = model[0].weight
    got = state_dict_entries(model, stats=False)
    assert [(e["key"], e["kind"]) for e in got["entries"]] == [("0.weight", "parameter"), ("1.weight", "parameter")]


def test_stats_per_entry() -> None:
    model = Small()
    with torch.no_grad():
        model.conv.weight[0, 0, 0, 0] = math.nan
        model.conv.weight[1, 0, 0, 0] = math.inf
    got = {e["key"]: e for e in state_dict_entries(model, stats=True)["entries"]}
    w = model.conv.weight.detach().double().reshape(-1)
    finite = w[torch.isfinite(w)]
    entry = got["conv.weight"]
    assert (entry["nan_count"], entry["inf_count"]) == (1, 1)
    assert entry["min"] == finite.min().item()
    assert entry["max"] == finite.max().item()
    assert entry["mean"] == pytest.approx(finite.mean().item(), rel=1e-12)
    assert entry["std"] == pytest.approx(finite.std(correction=0).item(), rel=1e-12)
    assert entry["norm"] == pytest.approx(finite.norm().item(), rel=1e-12)
    assert got["bn.running_var"]["mean"] == 1.0
    assert {k: got["scale"][k] for k in finite_stats(model.get_buffer("scale"))} == finite_stats(
        model.get_buffer("scale")
    )
    assert got["scale"]["std"] == 0.5


def test_checkpoint_entries_guess_kinds() -> None:
    sd = Small().state_dict() | {"ids": torch.arange(3)}
    got = checkpoint_state_dict_entries(sd, stats=False)
    kinds = {e["key"]: e["kind"] for e in got["entries"]}
    assert kinds == {
        "conv.weight": "parameter",
        "conv.bias": "parameter",
        "bn.weight": "parameter",
        "bn.bias": "parameter",
        "bn.running_mean": "buffer",
        "bn.running_var": "buffer",
        "bn.num_batches_tracked": "buffer",
        "fc.weight": "parameter",
        "scale": "parameter",  # a float buffer cannot be told from a parameter by name
        "ids": "buffer",
    }
    assert all(e["requires_grad"] is None for e in got["entries"])
    assert got["total_numel"] == sum(v.numel() for v in sd.values())
    assert looks_like_buffer("layer1.0.bn1.running_mean")
    assert not looks_like_buffer("running_mean_proj.weight")


def test_get_tensor() -> None:
    model = Small()
    t = get_tensor(model, "conv.weight")
    assert torch.equal(t, model.conv.weight)
    assert not t.requires_grad
    with pytest.raises(
        NotFound, match=r"no tensor 'conv\.wieght' in the state dict; closest: 'conv\.weight', "
    ) as info:
        get_tensor(model, "conv.wieght")
    assert info.value.status == 404
    with pytest.raises(NotFound):
        get_tensor(model, "scratch")  # not persistent, so not in the state dict
    with pytest.raises(NotFound) as info:
        get_tensor(nn.ReLU(), "weight")  # no tensor at all, so none is close
    assert info.value.detail == "no tensor 'weight' in the state dict"
