"""reduce_tensor, tensor_summary and finite_stats against direct float64 computations."""

from __future__ import annotations

import math

import pytest
import torch

from service.introspection import tensor_stats
from service.introspection.tensor_stats import finite_stats, reduce_tensor, tensor_summary
from service.specs.vocab import Reduce


def _x() -> torch.Tensor:
    return torch.randn(2, 3, 4, 5, generator=torch.Generator().manual_seed(0))


def test_reduce_mean_max_flatten() -> None:
    x = _x()
    assert torch.equal(reduce_tensor(x, Reduce.mean), x.mean(dim=(2, 3)))
    assert torch.equal(reduce_tensor(x, Reduce.max), x.amax(dim=(2, 3)))
    assert reduce_tensor(x, Reduce.mean).shape == (2, 3)
    assert torch.equal(reduce_tensor(x, Reduce.flatten), x.reshape(2, 60))
    assert reduce_tensor(x, None) is x
    assert torch.equal(reduce_tensor(x, "mean"), x.mean(dim=(2, 3)))  # type: ignore[arg-type]
    seq = torch.randn(2, 3, 7)
    assert torch.equal(reduce_tensor(seq, Reduce.max), seq.amax(dim=2))


def test_reduce_leaves_tensors_without_spatial_dims() -> None:
    logits = torch.randn(4, 10)
    assert reduce_tensor(logits, Reduce.mean) is logits
    assert reduce_tensor(logits, Reduce.max) is logits
    assert torch.equal(reduce_tensor(logits, Reduce.flatten), logits)
    vec = torch.arange(3.0)
    assert torch.equal(reduce_tensor(vec, Reduce.flatten), vec.reshape(3, 1))


def test_reduce_empty_spatial_dims() -> None:
    empty = torch.zeros(2, 3, 0)
    assert reduce_tensor(empty, Reduce.max).shape == (2, 3)
    assert torch.isnan(reduce_tensor(empty, Reduce.max)).all()
    assert torch.isnan(reduce_tensor(empty, Reduce.mean)).all()


def test_tensor_summary_exact() -> None:
    t = torch.tensor([[0.0, 1.0], [2.0, 3.0]], dtype=torch.float16)
    assert tensor_summary(t) == {
        "shape": [2, 2],
        "dtype": "float16",
        "min": 0.0,
        "max": 3.0,
        "mean": 1.5,
        "std": math.sqrt(1.25),
        "zero_fraction": 0.25,
    }


def test_tensor_summary_random_matches_float64() -> None:
    x = _x().relu()
    d = x.double()
    got = tensor_summary(x)
    assert got["std"] == d.std(correction=0).item()
    assert got["mean"] == d.mean().item()
    assert got["zero_fraction"] == (x == 0).sum().item() / x.numel()


def test_tensor_summary_non_finite_and_empty() -> None:
    got = tensor_summary(torch.tensor([1.0, math.nan]))
    assert got["min"] is None
    assert got["mean"] is None
    assert got["std"] is None
    assert got["zero_fraction"] == 0.0
    assert tensor_summary(torch.tensor([1.0, math.inf]))["max"] is None
    empty = tensor_summary(torch.zeros(0, 3))
    assert empty == {"shape": [0, 3], "dtype": "float32"} | dict.fromkeys(
        ("min", "max", "mean", "std", "zero_fraction")
    )
    assert tensor_summary(torch.tensor([True, False]))["mean"] == 0.5


def _direct(t: torch.Tensor) -> dict[str, float]:
    d = t.double().reshape(-1)
    f = d[torch.isfinite(d)]
    return {
        "min": f.min().item(),
        "max": f.max().item(),
        "mean": f.mean().item(),
        "std": f.std(correction=0).item(),
        "norm": f.norm().item(),
    }


def test_finite_stats_ignores_nan_and_inf() -> None:
    t = torch.tensor([1.0, -2.0, math.nan, math.inf, -math.inf, 4.0, math.nan])
    got = finite_stats(t)
    assert got["nan_count"] == 2
    assert got["inf_count"] == 2
    assert got["min"] == -2.0
    assert got["max"] == 4.0
    assert got["mean"] == 1.0
    assert got["std"] == pytest.approx(math.sqrt(6.0), rel=1e-15)
    assert got["norm"] == pytest.approx(math.sqrt(21.0), rel=1e-15)


def test_finite_stats_no_finite_element() -> None:
    got = finite_stats(torch.tensor([math.nan, math.inf]))
    assert got == dict.fromkeys(("min", "max", "mean", "std", "norm")) | {"nan_count": 1, "inf_count": 1}
    assert finite_stats(torch.zeros(0))["mean"] is None


@pytest.mark.parametrize("chunk", [1, 7, 1 << 22])
def test_finite_stats_chunks_merge_exactly(monkeypatch: pytest.MonkeyPatch, chunk: int) -> None:
    monkeypatch.setattr(tensor_stats, "_CHUNK", chunk)
    t = torch.randn(300, generator=torch.Generator().manual_seed(3)) * 5 + 1000  # mean >> std
    t[10] = math.nan
    t[200] = -math.inf
    got = finite_stats(t.reshape(3, 100))
    want = _direct(t)
    assert got["min"] == want["min"]
    assert got["max"] == want["max"]
    for key in ("mean", "std", "norm"):
        assert got[key] == pytest.approx(want[key], rel=1e-12), key
    assert (got["nan_count"], got["inf_count"]) == (1, 1)


def test_finite_stats_integer_and_bool() -> None:
    got = finite_stats(torch.tensor([3, 5], dtype=torch.int64))
    assert got == {"min": 3.0, "max": 5.0, "mean": 4.0, "std": 1.0, "norm": math.sqrt(34.0)} | {
        "nan_count": 0,
        "inf_count": 0,
    }
    assert finite_stats(torch.tensor([True, False, True]))["mean"] == pytest.approx(2 / 3, rel=1e-15)
