"""summarize: parity with torchinfo.summary (rows, shapes, columns, totals, text); the model is left as it was."""

from __future__ import annotations

import functools
import re
from typing import Any

import pytest
import timm
import torch
import torchinfo
import torchinfo.torchinfo as torchinfo_impl
import torchvision
from torch import Tensor, nn

from service.errors import InvalidField
from service.introspection.hooks import count_hooks
from service.introspection.summary import summarize

CPU = torch.device("cpu")


class LeNet(nn.Module):
    """The classic LeNet-5 shape for 3x32x32 inputs, with one ReLU module used four times."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(400, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)
        self.relu = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        x = self.pool(self.relu(self.conv1(x)))
        x = self.pool(self.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        x = self.relu(self.fc1(x))
        x = self.relu(self.fc2(x))
        return torch.as_tensor(self.fc3(x))


def _models() -> dict[str, tuple[nn.Module, list[int]]]:
    torch.manual_seed(0)
    return {
        "lenet": (LeNet().eval(), [1, 3, 32, 32]),
        "resnet18": (torchvision.models.resnet18(weights=None).eval(), [1, 3, 64, 64]),
        "efficientvit_b0": (
            timm.create_model("efficientvit_b0", pretrained=False, features_only=True).eval(),
            [2, 3, 64, 64],
        ),
    }


MODELS = _models()


def _number(cell: str) -> int:
    """A torchinfo Param #/Mult-Adds cell as an int ("--" and "(recursive)" are 0)."""
    if cell in ("--", "(recursive)"):
        return 0
    return int(cell.strip("()").replace(",", ""))


def _table_rows(stats: Any) -> list[dict[str, Any]]:
    """The layer rows of a torchinfo table, cut at its fixed column positions."""
    lines = str(stats).splitlines()
    dividers = [i for i, line in enumerate(lines) if line and set(line) == {"="}]
    width, col = stats.formatting.layer_name_width, stats.formatting.col_width
    rows = []
    for line in lines[dividers[1] + 1 : dividers[2]]:
        cells = [line[width + 1 + i * (col + 1) : width + 1 + (i + 1) * (col + 1)].strip() for i in range(3)]
        label = re.sub(r"^[│ ]*[├└]─", "", line[:width].strip())
        match = re.fullmatch(r"(\w+)(?:: (\d+)-(\d+))?", label)
        assert match, label
        rows.append(
            {
                "type": match[1],
                "depth": int(match[2] or 0),
                "depth_index": int(match[3] or 1),
                "output_shape": [int(v) for v in re.findall(r"\d+", cells[0])],
                "num_parameters": _number(cells[1]),
                "mult_adds": _number(cells[2]),
            }
        )
    return rows


@pytest.mark.parametrize("depth", [1, 2, 3])
@pytest.mark.parametrize("model_name", list(MODELS))
def test_parity_with_torchinfo(model_name: str, depth: int) -> None:
    model, size = MODELS[model_name]
    got = summarize(model, size, depth, CPU, torch.float32)
    plain = torchinfo.summary(model, input_size=size, depth=depth, verbose=0, device=CPU)
    wide = torchinfo.summary(
        model, input_size=size, depth=depth, verbose=0, device=CPU, col_names=("output_size", "num_params", "mult_adds")
    )

    units = {"(Units.MEGABYTES)": "(M)", "(Units.GIGABYTES)": "(G)", "(Units.TERABYTES)": "(T)"}
    assert got["text"] == functools.reduce(lambda t, u: t.replace(*u), units.items(), str(plain))
    for key in ("total_params", "trainable_params", "total_mult_adds"):
        assert got[key] == getattr(plain, key), key
    assert got["non_trainable_params"] == plain.total_params - plain.trainable_params
    assert got["input_size_mb"] == plain.total_input / 1e6
    assert got["forward_backward_pass_size_mb"] == plain.total_output_bytes / 1e6
    assert got["params_size_mb"] == plain.total_param_bytes / 1e6
    total = plain.total_input + plain.total_output_bytes + plain.total_param_bytes
    assert got["estimated_total_size_mb"] == total / 1e6

    table = _table_rows(wide)
    assert [{k: r[k] for k in table[0]} for r in got["rows"]] == table
    printed = [info for info in plain.summary_list if info.depth <= depth]
    assert [r["output_shape"] for r in got["rows"]] == [info.output_size for info in printed]

    modules = dict(model.named_modules())
    for row, info in zip(got["rows"], printed, strict=True):
        assert modules[row["name"]] is info.module
        assert type(modules[row["name"]]).__name__ == row["type"]
    assert sum(r["num_parameters"] for r in got["rows"]) == got["total_params"]
    assert sum(r["mult_adds"] for r in got["rows"]) == got["total_mult_adds"]


def test_lenet_rows_name_the_shared_relu() -> None:
    model, size = MODELS["lenet"]
    rows = summarize(model, size, 1, CPU, torch.float32)["rows"]
    assert [r["name"] for r in rows] == [
        "",
        "conv1",
        "relu",
        "pool",
        "conv2",
        "relu",
        "pool",
        "fc1",
        "relu",
        "fc2",
        "relu",
        "fc3",
    ]
    assert [r["recursive"] for r in rows if r["name"] == "relu"] == [False, True, True, True]
    assert rows[1] | {"recursive": False} == {
        "name": "conv1",
        "type": "Conv2d",
        "depth": 1,
        "depth_index": 1,
        "output_shape": [1, 6, 28, 28],
        "num_parameters": 3 * 6 * 25 + 6,
        "mult_adds": (3 * 6 * 25 + 6) * 28 * 28,
        "recursive": False,
    }
    assert rows[0]["num_parameters"] == 0  # the root's own (leftover) parameters, as printed: "--"


def test_depth_zero_is_the_root_only() -> None:
    model, size = MODELS["resnet18"]
    got = summarize(model, size, 0, CPU, torch.float32)
    assert [r["name"] for r in got["rows"]] == [""]
    assert got["rows"][0]["num_parameters"] == got["total_params"] == 11689512


def test_model_left_untouched() -> None:
    model = LeNet()
    model.train()
    model.fc1.eval()
    modes = {name: m.training for name, m in model.named_modules()}
    params = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    summarize(model, [2, 3, 32, 32], 2, CPU, torch.float32)
    assert {name: m.training for name, m in model.named_modules()} == modes
    assert count_hooks(model) == 0
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(v, params[k]) for k, v in model.state_dict().items())
    assert "LeNet" not in torchinfo_impl._cached_forward_pass  # torchinfo's cache would pin the model


def test_batch_norm_statistics_do_not_move() -> None:
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2)).train()
    before = model.get_buffer("1.running_mean").clone()
    summarize(model, [4, 1, 8, 8], 1, CPU, torch.float32)
    assert torch.equal(model.get_buffer("1.running_mean"), before)
    assert model.training


def test_failed_forward_is_422_and_cleans_up() -> None:
    model = LeNet().eval()
    with pytest.raises(InvalidField, match=r"input_size \[1, 1, 32, 32\]") as info:
        summarize(model, [1, 1, 32, 32], 2, CPU, torch.float32)
    assert "channels" in info.value.detail
    assert count_hooks(model) == 0
    assert not model.training


@pytest.mark.parametrize("size", [[], [1, 0, 4], [1, -3]])
def test_bad_input_size(size: list[int]) -> None:
    with pytest.raises(InvalidField, match="input_size"):
        summarize(LeNet(), size, 1, CPU, torch.float32)


def test_a_negative_depth_is_refused_by_name() -> None:
    with pytest.raises(InvalidField) as info:
        summarize(LeNet(), [1, 3, 32, 32], -1, CPU, torch.float32)
    assert info.value.detail == "depth must be >= 0"


def test_summarizing_prints_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    """torchinfo prints its table at verbose >= 1: into the server's stdout, for every /summary."""
    summarize(LeNet().eval(), [1, 3, 32, 32], 1, CPU, torch.float32)
    assert capsys.readouterr().out == ""


def test_refuses_to_move_the_model() -> None:
    model = LeNet()
    with pytest.raises(ValueError, match="the model is on cpu"):
        summarize(model, [1, 3, 32, 32], 1, torch.device("meta"), torch.float32)
    assert model.conv1.weight.device.type == "cpu"


def test_other_dtype() -> None:
    model = LeNet().to(torch.float64).eval()
    got = summarize(model, [1, 3, 32, 32], 1, CPU, torch.float64)
    assert got["params_size_mb"] == 62006 * 8 / 1e6
