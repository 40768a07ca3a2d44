"""layer_tree, resolve_layers and last_conv2d on small hand-built module trees."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from service.errors import InvalidField
from service.introspection.layers import (
    LayerNode,
    closest_names,
    last_conv2d,
    layer_tree,
    module_names,
    resolve_layers,
)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 1)  # 2*3 + 3 = 9 parameters
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(self.act(self.conv(x)))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(1, 2, 3, bias=False)  # 18 parameters
        self.layer1 = nn.Sequential(Block(), Block())
        self.head = nn.Linear(3, 4)  # 16 parameters
        self.alias = self.head  # the same module under a second name


def test_layer_tree_lists_every_module_once_with_subtree_counts() -> None:
    nodes = layer_tree(Net())
    assert [n.name for n in nodes] == [
        "",
        "stem",
        "layer1",
        "layer1.0",
        "layer1.0.conv",
        "layer1.0.act",
        "layer1.1",
        "layer1.1.conv",
        "layer1.1.act",
        "head",
    ]
    by_name = {n.name: n for n in nodes}
    assert by_name[""] == LayerNode("", "Net", 0, 18 + 9 + 9 + 16, ["stem", "layer1", "head"])
    assert by_name["layer1"] == LayerNode("layer1", "Sequential", 1, 18, ["layer1.0", "layer1.1"])
    assert by_name["layer1.1.conv"] == LayerNode("layer1.1.conv", "Conv2d", 3, 9, [])
    assert by_name["layer1.0.act"].num_parameters == 0
    assert by_name["head"].depth == 1


def test_layer_tree_counts_a_tied_parameter_once() -> None:
    model = nn.Sequential(nn.Linear(2, 2, bias=False), nn.Linear(2, 2, bias=False))
    model[1].weight = model[0].weight
    assert layer_tree(model)[0].num_parameters == 4


def test_resolve_layers_exact_and_patterns_in_module_order() -> None:
    model = Net()
    got = resolve_layers(module_names(model), ["head", "layer1.*.conv", "stem", "head"], max_layers=10)
    assert got == ["stem", "layer1.0.conv", "layer1.1.conv", "head"]
    assert resolve_layers(module_names(model), ["layer1.?"], 10) == ["layer1.0", "layer1.1"]
    assert resolve_layers(module_names(model), ["layer1.[1]"], 10) == ["layer1.1"]


def test_resolve_layers_root_only_by_exact_empty_name() -> None:
    model = Net()
    assert "" not in resolve_layers(module_names(model), ["*"], 100)
    assert resolve_layers(module_names(model), ["*"], 100) == [n.name for n in layer_tree(model)][1:]
    assert resolve_layers(module_names(model), ["", "head"], 10) == ["", "head"]


def test_unknown_name_lists_closest() -> None:
    with pytest.raises(InvalidField) as info:
        resolve_layers(module_names(Net()), ["layer1.0.cnv"], 10)
    assert info.value.status == 422
    assert "'layer1.0.cnv'" in info.value.detail
    assert "'layer1.0.conv'" in info.value.detail


def test_pattern_matching_nothing_is_invalid() -> None:
    with pytest.raises(
        InvalidField, match=r"pattern 'layer9\.\*' matches no layer; closest: 'layer1.1', 'layer1.0', 'layer1',"
    ):
        resolve_layers(module_names(Net()), ["layer9.*"], 10)


def test_every_bad_pattern_is_reported() -> None:
    with pytest.raises(InvalidField) as info:
        resolve_layers(module_names(Net()), ["nope", "stem", "zzz*"], 10)
    assert "'nope'" in info.value.detail
    assert "'zzz*'" in info.value.detail


def test_too_many_layers_and_empty_list() -> None:
    with pytest.raises(InvalidField, match="9 layers match, more than the limit of 3"):
        resolve_layers(module_names(Net()), ["*"], 3)
    with pytest.raises(InvalidField, match="at least one layer"):
        resolve_layers(module_names(Net()), [], 3)


def test_refusals_point_to_the_listing_of_layers() -> None:
    for patterns in (["nope"], []):
        with pytest.raises(InvalidField) as info:
            resolve_layers(module_names(Net()), patterns, 3)
        assert info.value.detail.endswith("(GET /models/{name}/layers lists them)")


def test_closest_names_falls_back_to_common_prefix() -> None:
    names = ["", "features", "features.0", "features.1", "classifier"]
    assert closest_names("features.17", names) == ["features.1", "features.0", "features"]
    assert closest_names("feat_qqqqqqqqqq", names) == ["features", "features.0", "features.1"]
    assert closest_names("qqq", names) == ["features", "classifier"]


def test_closest_names_tries_every_prefix_length() -> None:
    # "fx" shares a 1-character prefix with "features" only: every shorter prefix is tried, one at a time
    assert closest_names("fx", ["", "features", "classifier"]) == ["features"]


def test_last_conv2d() -> None:
    assert last_conv2d(Net()) == "layer1.1.conv"
    assert last_conv2d(nn.Sequential(nn.Linear(2, 2))) is None
