"""Streaming unit statistics and exemplars: any chunking gives the whole set's answer."""

from __future__ import annotations

import torch

from service.introspection.unit_stats import Exemplars, UnitStats, units


def test_units_are_channels_or_the_token_dimension() -> None:
    assert units(torch.zeros(2, 3, 4, 5)).shape == (2, 3, 20)
    assert units(torch.zeros(2, 7)).shape == (2, 7, 1)
    assert units(torch.zeros(2, 9, 6)).shape == (2, 6, 9)  # [N, T, D]: D units over T tokens


def test_chunked_statistics_equal_the_whole_set() -> None:
    torch.manual_seed(0)
    x = torch.randn(50, 4, 3, 3) * torch.tensor([1.0, 10.0, 0.1, 1e3])[None, :, None, None] + 5
    stats = UnitStats.first(x[:7], bins=10, value_range=(-10.0, 20.0))
    for start in range(7, 50, 11):
        stats.update(x[start : start + 11])
    restored = UnitStats.from_state(stats.state())
    got = restored.result()
    v = x.double().transpose(0, 1).reshape(4, -1)
    torch.testing.assert_close(torch.tensor(got["mean"], dtype=torch.float64), v.mean(dim=1), rtol=1e-12, atol=0)
    torch.testing.assert_close(
        torch.tensor(got["std"], dtype=torch.float64), v.std(dim=1, unbiased=False), rtol=1e-10, atol=0
    )
    assert got["max"] == v.amax(dim=1).tolist()
    assert got["fraction_positive"] == (v > 0).double().mean(dim=1).tolist()
    edges = torch.linspace(-10, 20, 11, dtype=torch.float64)
    for unit in range(4):
        row = v[unit]
        inside = row[(row >= -10) & (row <= 20)]
        assert got["histogram"]["counts"][unit] == torch.histogram(inside, edges).hist.to(torch.int64).tolist()
        assert got["histogram"]["under"][unit] == int((row < -10).sum())
        assert got["histogram"]["over"][unit] == int((row > 20).sum())


def test_exemplars_keep_the_top_k_with_ties_to_the_earlier_sample() -> None:
    scores = torch.tensor([[1.0, 3.0], [3.0, 3.0], [2.0, 3.0], [3.0, 0.0], [0.5, 3.0]])  # [N, U]
    found = Exemplars.empty(3, "max")
    found.update(scores[:2], torch.tensor([0, 1]))
    found.update(scores[2:], torch.tensor([2, 3, 4]))
    assert found.indices.tolist() == [[1, 3, 2], [0, 1, 2]]
    assert found.scores.tolist() == [[3.0, 3.0, 2.0], [3.0, 3.0, 3.0]]
