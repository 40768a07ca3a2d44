"""GET /models/{name}/layers, /summary, /state-dict and /optimizer against direct computations."""

from __future__ import annotations

import io
import json
import math
import re
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import timm
import torch
import torchinfo
import torchvision
from fastapi.testclient import TestClient
from safetensors.torch import load as safetensors_load
from torch import nn

from service.zoo.lenet import LeNet, load_lenet, weights_path
from tests.conftest import ClientFactory, assert_no_module_hooks, write_lenet

TINY_PY = """
from torch import nn


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.bn = nn.BatchNorm1d(3)

    def forward(self, x):
        return self.bn(self.fc(x))
"""

TINY_TOML = """
[[models]]
name = "tiny"
source = "python"
architecture = "tiny.py:Tiny"
weights = "tiny.pt"
input_size = [4]

[[models]]
name = "tiny_adam"
source = "python"
architecture = "tiny.py:Tiny"
input_size = [4]
[models.optimizer]
type = "Adam"
lr = 0.01
betas = [0.8, 0.9]
weight_decay = 0.1
"""


def served(client: TestClient, name: str) -> nn.Module:
    app: Any = client.app
    module: nn.Module = app.state.hookserve.fleet.ready(name).model.module
    return module


def get_json(client: TestClient, url: str, **params: Any) -> Any:
    response = client.get(url, params=params)
    assert response.status_code == 200, response.text
    return response.json()


class Tiny(nn.Module):
    """The same class as TINY_PY, for direct computations."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.bn = nn.BatchNorm1d(3)


def tiny_weights() -> dict[str, torch.Tensor]:
    """fc.weight with one NaN, +Inf and -Inf planted; fc.bias all NaN; sane batch-norm buffers."""
    weight = torch.arange(12, dtype=torch.float32).reshape(3, 4) - 4.5
    weight[0, 0] = math.nan
    weight[1, 1] = math.inf
    weight[2, 2] = -math.inf
    return {
        "fc.weight": weight,
        "fc.bias": torch.full((3,), math.nan),
        "bn.weight": torch.tensor([1.0, 2.0, 3.0]),
        "bn.bias": torch.tensor([0.0, -1.0, 0.5]),
        "bn.running_mean": torch.tensor([0.1, 0.2, 0.3]),
        "bn.running_var": torch.tensor([1.0, 4.0, 9.0]),
        "bn.num_batches_tracked": torch.tensor(5),
    }


@pytest.fixture
def tiny_client(tmp_path: Any, make_client: ClientFactory) -> TestClient:
    (tmp_path / "tiny.py").write_text(TINY_PY)
    torch.save(tiny_weights(), tmp_path / "tiny.pt")
    client = make_client(TINY_TOML)
    for name in ("tiny", "tiny_adam"):
        assert client.get(f"/models/{name}").json()["status"] == "ready"
    return client


# ---- /layers -----------------------------------------------------------------------------------


def test_layers_of_lenet_exactly(builtin_client: TestClient) -> None:
    layers = get_json(builtin_client, "/models/lenet/layers")["layers"]
    assert layers == [
        {
            "name": "",
            "type": "LeNet",
            "depth": 0,
            "num_parameters": 62006,
            "children": ["conv1", "pool", "conv2", "fc1", "fc2", "fc3", "relu"],
        },
        {"name": "conv1", "type": "Conv2d", "depth": 1, "num_parameters": 456, "children": []},
        {"name": "pool", "type": "MaxPool2d", "depth": 1, "num_parameters": 0, "children": []},
        {"name": "conv2", "type": "Conv2d", "depth": 1, "num_parameters": 2416, "children": []},
        {"name": "fc1", "type": "Linear", "depth": 1, "num_parameters": 48120, "children": []},
        {"name": "fc2", "type": "Linear", "depth": 1, "num_parameters": 10164, "children": []},
        {"name": "fc3", "type": "Linear", "depth": 1, "num_parameters": 850, "children": []},
        {"name": "relu", "type": "ReLU", "depth": 1, "num_parameters": 0, "children": []},
    ]


def test_layers_of_resnet18_follow_named_modules(builtin_client: TestClient) -> None:
    layers = get_json(builtin_client, "/models/resnet18/layers")["layers"]
    ref = torchvision.models.resnet18()
    expected = []
    for name, module in ref.named_modules():
        expected.append(
            {
                "name": name,
                "type": type(module).__name__,
                "depth": 0 if name == "" else len(name.split(".")),
                "num_parameters": sum(p.numel() for p in module.parameters()),
                "children": [f"{name}.{c}" if name else c for c, _ in module.named_children()],
            }
        )
    assert layers == expected
    by_name = {layer["name"]: layer for layer in layers}
    assert by_name[""]["num_parameters"] == 11689512
    assert by_name["layer2.0.downsample"]["children"] == ["layer2.0.downsample.0", "layer2.0.downsample.1"]
    assert by_name["layer2.0.downsample.1"]["depth"] == 4
    assert by_name["layer2.0.downsample"]["num_parameters"] == 64 * 128 + 2 * 128


def test_layers_unknown_model_is_404(builtin_client: TestClient) -> None:
    assert builtin_client.get("/models/nope/layers").status_code == 404


# ---- /summary ----------------------------------------------------------------------------------


def _table_rows(text: str) -> list[list[str]]:
    """The body rows of a torchinfo table: [layer, output shape, param #, mult-adds] per row."""
    lines = text.splitlines()
    rules = [i for i, line in enumerate(lines) if line and set(line) == {"="}]
    rows = []
    for line in lines[rules[1] + 1 : rules[2]]:
        rows.append(re.split(r"\s{2,}", re.sub(r"^[│ ]*[├└]─", "", line).strip()))
    return rows


def _number(cell: str) -> int:
    return 0 if cell in ("--", "(recursive)") else int(cell.replace(",", ""))


def _reference(name: str) -> nn.Module:
    if name == "lenet":
        return load_lenet()
    model: nn.Module = (
        torchvision.models.resnet18()
        if name == "resnet18"
        else timm.create_model("efficientvit_b0", features_only=True)
    )
    return model.eval()


@pytest.mark.parametrize(
    ("name", "input_size"),
    [("lenet", None), ("resnet18", [1, 3, 64, 64]), ("efficientvit_b0", None), ("efficientvit_b0", [2, 3, 64, 64])],
)
@pytest.mark.parametrize("depth", [0, 1, 3])
def test_summary_equals_torchinfo(
    builtin_client: TestClient, name: str, input_size: list[int] | None, depth: int
) -> None:
    params: dict[str, Any] = {"depth": depth}
    if input_size is not None:
        params["input_size"] = ",".join(map(str, input_size))
    got = get_json(builtin_client, f"/models/{name}/summary", **params)
    info = get_json(builtin_client, f"/models/{name}")
    size = input_size or [1, *info["input_size"]]
    ref = _reference(name)
    stats = torchinfo.summary(ref, input_size=size, depth=depth, verbose=0)
    columns = torchinfo.summary(
        ref, input_size=size, depth=depth, verbose=0, col_names=("output_size", "num_params", "mult_adds")
    )

    # torchinfo's own text, with its unit as torchinfo means it: Python 3.11 formats the `Units` str Enum in an
    # f-string as `Units.MEGABYTES`, and the service prints its value (`M`).
    expected_text = re.sub(r"\(Units\.(\w+)\)", lambda m: f"({torchinfo.Units[m.group(1)].value})", str(stats))
    assert got["text"] == expected_text
    assert "Units." not in got["text"]
    assert "Total mult-adds (" in got["text"]
    assert got["total_params"] == stats.total_params
    assert got["trainable_params"] == stats.trainable_params
    assert got["non_trainable_params"] == stats.total_params - stats.trainable_params
    assert got["total_mult_adds"] == stats.total_mult_adds
    assert got["input_size_mb"] == pytest.approx(stats.to_megabytes(stats.total_input))
    assert got["forward_backward_pass_size_mb"] == pytest.approx(stats.to_megabytes(stats.total_output_bytes))
    assert got["params_size_mb"] == pytest.approx(stats.to_megabytes(stats.total_param_bytes))
    total = stats.total_input + stats.total_output_bytes + stats.total_param_bytes
    assert got["estimated_total_size_mb"] == pytest.approx(stats.to_megabytes(total))

    names: dict[int, str] = {}
    for module_name, module in ref.named_modules():
        names.setdefault(id(module), module_name)
    visible = [row for row in stats.summary_list if row.depth <= depth]
    table = _table_rows(str(columns))
    assert len(got["rows"]) == len(visible) == len(table)
    for row, layer, cells in zip(got["rows"], visible, table, strict=True):
        assert row["name"] == names[layer.layer_id]
        assert row["type"] == layer.class_name
        assert row["depth"] == layer.depth
        assert row["depth_index"] == layer.depth_index
        assert row["output_shape"] == layer.output_size
        assert cells[0].split(":")[0] == layer.class_name
        assert row["num_parameters"] == _number(cells[2]), row["name"]
        assert row["mult_adds"] == _number(cells[3]), row["name"]
    assert got["rows"][0]["name"] == ""
    assert max(row["depth"] for row in got["rows"]) == min(depth, max(row.depth for row in stats.summary_list))

    model = served(builtin_client, name)
    assert info["hooks"] == 0
    assert builtin_client.get(f"/models/{name}").json()["hooks"] == 0
    assert not any(module.training for module in model.modules())
    assert_no_module_hooks(model)


def test_summary_is_cached_and_leaves_weights_alone(builtin_client: TestClient) -> None:
    before = {k: v.clone() for k, v in served(builtin_client, "resnet18").state_dict().items()}
    first = get_json(builtin_client, "/models/resnet18/summary", input_size="1,3,32,32", depth=2)
    second = get_json(builtin_client, "/models/resnet18/summary", input_size="1,3,32,32", depth=2)
    assert first == second
    after = served(builtin_client, "resnet18").state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # batch-norm statistics did not move


@pytest.mark.parametrize(
    ("params", "status"),
    [
        ({"input_size": "1,3,abc"}, 422),
        ({"input_size": "0,3,32,32"}, 422),
        ({"input_size": "1,3,8,8"}, 422),  # lenet's forward cannot run on 8x8
        ({"input_size": "1,3,32,32", "depth": -1}, 422),
        ({"input_size": "1,3,32,32", "depth": "x"}, 422),
    ],
)
def test_summary_bad_arguments_are_422(builtin_client: TestClient, params: dict[str, Any], status: int) -> None:
    response = builtin_client.get("/models/lenet/summary", params=params)
    assert response.status_code == status, response.text
    assert "Traceback" not in response.text
    assert builtin_client.get("/models/lenet").json()["hooks"] == 0
    assert not any(module.training for module in served(builtin_client, "lenet").modules())


# ---- /state-dict -------------------------------------------------------------------------------


def _meta(key: str, t: torch.Tensor, kind: str, requires_grad: bool) -> dict[str, Any]:
    return {
        "key": key,
        "shape": list(t.shape),
        "dtype": str(t.dtype).removeprefix("torch."),
        "numel": t.numel(),
        "bytes": t.numel() * t.element_size(),
        "kind": kind,
        "requires_grad": requires_grad,
    }


@pytest.mark.parametrize("name", ["lenet", "resnet18"])
def test_state_dict_metadata(builtin_client: TestClient, name: str) -> None:
    got = get_json(builtin_client, f"/models/{name}/state-dict")
    ref = _reference(name)
    params = dict(ref.named_parameters())
    expected = [_meta(k, v, "parameter" if k in params else "buffer", k in params) for k, v in ref.state_dict().items()]
    assert got["entries"] == expected
    assert got["num_tensors"] == len(expected)
    assert got["total_numel"] == sum(e["numel"] for e in expected)
    assert got["total_bytes"] == sum(e["bytes"] for e in expected)
    if name == "resnet18":
        tracked = next(e for e in got["entries"] if e["key"] == "bn1.num_batches_tracked")
        assert tracked == {
            "key": "bn1.num_batches_tracked",
            "shape": [],
            "dtype": "int64",
            "numel": 1,
            "bytes": 8,
            "kind": "buffer",
            "requires_grad": False,
        }


def _finite_stats(t: torch.Tensor) -> dict[str, Any]:
    x = t.double().flatten()
    finite = x[torch.isfinite(x)]
    stats: dict[str, Any] = {"nan_count": int(torch.isnan(x).sum()), "inf_count": int(torch.isinf(x).sum())}
    if finite.numel() == 0:
        return stats | dict.fromkeys(("min", "max", "mean", "std", "norm"))
    mean = finite.mean().item()
    return stats | {
        "min": finite.min().item(),
        "max": finite.max().item(),
        "mean": mean,
        "std": math.sqrt(((finite - mean) ** 2).mean().item()),
        "norm": math.sqrt((finite**2).sum().item()),
    }


def _assert_stats(entry: dict[str, Any], expected: dict[str, Any]) -> None:
    for field, value in expected.items():
        if value is None or field.endswith("_count"):
            assert entry[field] == value, (entry["key"], field)
        else:
            assert entry[field] == pytest.approx(value, rel=1e-9, abs=1e-9), (entry["key"], field)


def test_state_dict_stats_against_float64(builtin_client: TestClient) -> None:
    got = get_json(builtin_client, "/models/lenet/state-dict", stats="true")
    sd = load_lenet().state_dict()
    assert [e["key"] for e in got["entries"]] == list(sd)
    for entry in got["entries"]:
        _assert_stats(entry, _finite_stats(sd[entry["key"]]))
        assert entry["std"] > 0
    plain = get_json(builtin_client, "/models/lenet/state-dict")
    assert "mean" not in plain["entries"][0]


def test_state_dict_counts_nan_and_inf(tiny_client: TestClient) -> None:
    got = get_json(tiny_client, "/models/tiny/state-dict", stats="true")
    weights = tiny_weights()
    by_key = {e["key"]: e for e in got["entries"]}
    assert list(by_key) == list(weights)
    for key, tensor in weights.items():
        _assert_stats(by_key[key], _finite_stats(tensor))
    weight = by_key["fc.weight"]
    assert (weight["nan_count"], weight["inf_count"]) == (1, 2)
    finite = [v - 4.5 for v in range(12) if v not in (0, 5, 10)]
    assert weight["min"] == -3.5
    assert weight["max"] == 6.5
    assert weight["mean"] == pytest.approx(sum(finite) / 9)
    bias = by_key["fc.bias"]
    assert (bias["nan_count"], bias["inf_count"]) == (3, 0)
    assert [bias[f] for f in ("min", "max", "mean", "std", "norm")] == [None] * 5
    tracked = by_key["bn.num_batches_tracked"]
    assert (tracked["min"], tracked["max"], tracked["std"], tracked["norm"]) == (5, 5, 0, 5)
    assert tracked["kind"] == "buffer"
    assert tracked["dtype"] == "int64"


def test_state_dict_download_npy_and_safetensors(builtin_client: TestClient) -> None:
    expected = load_lenet().state_dict()["conv1.weight"]
    response = builtin_client.get("/models/lenet/state-dict", params={"key": "conv1.weight", "format": "npy"})
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/octet-stream"
    array = np.load(io.BytesIO(response.content), allow_pickle=False)
    assert array.dtype == np.float32
    assert torch.equal(torch.from_numpy(array), expected)

    response = builtin_client.get("/models/lenet/state-dict", params={"key": "conv1.weight"})
    assert torch.equal(torch.from_numpy(np.load(io.BytesIO(response.content))), expected)  # npy by default

    response = builtin_client.get("/models/lenet/state-dict", params={"key": "fc3.bias", "format": "safetensors"})
    assert response.status_code == 200
    tensors = safetensors_load(response.content)
    assert list(tensors) == ["fc3.bias"]
    assert torch.equal(tensors["fc3.bias"], load_lenet().state_dict()["fc3.bias"])
    (length,) = struct.unpack("<Q", response.content[:8])
    metadata = json.loads(response.content[8 : 8 + length])["__metadata__"]
    assert json.loads(metadata["response"]) == {"model": "lenet", "key": "fc3.bias"}


def test_state_dict_download_keeps_zero_dim_shape(builtin_client: TestClient) -> None:
    params = {"key": "bn1.num_batches_tracked", "format": "npy"}
    tracked = builtin_client.get("/models/resnet18/state-dict", params=params)
    array = np.load(io.BytesIO(tracked.content))
    assert array.dtype == np.int64
    assert array.shape == ()


def test_state_dict_unknown_key_and_bad_format(builtin_client: TestClient) -> None:
    response = builtin_client.get("/models/lenet/state-dict", params={"key": "conv1.weights", "format": "npy"})
    assert response.status_code == 404
    assert "'conv1.weight'" in response.json()["detail"]
    response = builtin_client.get("/models/lenet/state-dict", params={"format": "npy"})
    assert response.status_code == 422
    response = builtin_client.get("/models/lenet/state-dict", params={"key": "conv1.weight", "format": "pt"})
    assert response.status_code == 422
    assert builtin_client.get("/models/nope/state-dict").status_code == 404


# ---- /optimizer --------------------------------------------------------------------------------


def test_optimizer_of_lenet_from_its_checkpoint(builtin_client: TestClient) -> None:
    got = get_json(builtin_client, "/models/lenet/optimizer")
    checkpoint = torch.load(weights_path(), map_location="cpu", weights_only=True)
    saved = checkpoint["optimizer_state_dict"]
    names = [name for name, _ in LeNet().named_parameters()]
    shapes = {name: list(p.shape) for name, p in LeNet().named_parameters()}

    assert got["type"] == "SGD"
    assert len(got["param_groups"]) == 1
    group = got["param_groups"][0]
    assert group["lr"] == 0.001
    assert group["momentum"] == 0.9
    assert {k: v for k, v in group.items() if k != "param_names"} == saved["param_groups"][0]
    assert group["params"] == list(range(10))
    assert group["param_names"] == names
    assert [s["param"] for s in got["state"]] == list(range(10))
    for entry in got["state"]:
        name = names[entry["param"]]
        assert entry["param_name"] == name
        assert entry["entries"] == {"momentum_buffer": {"shape": shapes[name], "dtype": "float32"}}

    app: Any = builtin_client.app
    optimizer = app.state.hookserve.fleet.ready("lenet").model.optimizer
    live = optimizer.state_dict()["state"]
    assert sorted(live) == sorted(saved["state"]) == list(range(10))
    for index, state in saved["state"].items():
        assert torch.equal(live[index]["momentum_buffer"], state["momentum_buffer"])
        assert state["momentum_buffer"].abs().sum() > 0


def test_optimizer_from_config(tiny_client: TestClient) -> None:
    got = get_json(tiny_client, "/models/tiny_adam/optimizer")
    expected = torch.optim.Adam(Tiny().parameters(), lr=0.01, betas=(0.8, 0.9), weight_decay=0.1).state_dict()
    group = expected["param_groups"][0]
    assert got["type"] == "Adam"
    assert got["param_groups"] == [
        {k: list(v) if isinstance(v, tuple) else v for k, v in group.items()}
        | {"param_names": ["fc.weight", "fc.bias", "bn.weight", "bn.bias"]}
    ]
    assert got["param_groups"][0]["betas"] == [0.8, 0.9]
    assert got["param_groups"][0]["eps"] == 1e-8
    assert got["state"] == []
    assert get_json(tiny_client, "/models/tiny_adam")["optimizer"] == "Adam"


def test_optimizer_404_without_one(builtin_client: TestClient, tiny_client: TestClient) -> None:
    for client, name in ((builtin_client, "resnet18"), (tiny_client, "tiny"), (builtin_client, "nope")):
        response = client.get(f"/models/{name}/optimizer")
        assert response.status_code == 404
        assert isinstance(response.json()["detail"], str)


def test_single_tensor_download_respects_the_binary_limit(make_client: ClientFactory, tmp_path: Path) -> None:
    client = make_client(write_lenet(tmp_path), max_binary_response_bytes=1000)
    small = client.get("/models/lenet/state-dict", params={"key": "conv1.bias", "format": "npy"})
    assert small.status_code == 200
    big = client.get("/models/lenet/state-dict", params={"key": "fc1.weight", "format": "safetensors"})
    assert big.status_code == 413
    assert "max_binary_response_bytes" in big.json()["detail"]
