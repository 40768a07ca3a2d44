"""Linear CKA from streamed sums: any chunking, a checkpoint in between, and large means give the full-matrix answer."""

from __future__ import annotations

import torch

from service.introspection.similarity import CrossCovariance, feature_count, linear_cka, sample_features
from service.jobs.datasets import Dataset
from service.jobs.kinds import SimilarityReduction
from tests.helpers.cka import textbook_cka


def test_chunked_cka_with_a_checkpoint_equals_the_full_matrices() -> None:
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(60, 5, 3, 3, generator=generator) + 1e4  # a large mean: sums of raw values would cancel
    mixed = a.mean(dim=(2, 3)) @ torch.randn(5, 7, generator=generator)
    b = torch.tanh(mixed) + torch.randn(60, 7, generator=generator)
    found = SimilarityReduction({"reduce": "flatten"})
    found.update({"a": a[:9], "b": b[:9]}, torch.arange(9))
    resumed = SimilarityReduction({"reduce": "flatten"})
    resumed.restore(found.state())
    for start in range(9, 60, 13):
        resumed.update({"a": a[start : start + 13], "b": b[start : start + 13]}, torch.arange(start, start + 13))
    result = resumed.result(Dataset.__new__(Dataset))
    assert result["layers"] == ["a", "b"]
    assert result["features"] == {"a": 45, "b": 7}
    expected = textbook_cka(a - 1e4, b)
    assert abs(result["cka"][0][1] - expected) < 1e-9
    assert result["cka"][1][0] == result["cka"][0][1]
    assert abs(result["cka"][0][0] - 1.0) < 1e-12


def test_a_constant_layer_has_no_cka() -> None:
    z = torch.cat([torch.ones(10, 2), torch.randn(10, 3, generator=torch.Generator().manual_seed(1))], dim=1)
    matrix = linear_cka(CrossCovariance.first(z.double()).centred(), [2, 3])
    assert matrix[0] == [None, None]
    assert abs(float(matrix[1][1] or 0) - 1.0) < 1e-12


def test_features_are_unit_means_or_every_value() -> None:
    t = torch.arange(24.0).reshape(2, 3, 4)  # [N, T, D]: D units over T tokens
    assert sample_features(t, "mean").tolist() == t.double().mean(dim=1).tolist()
    assert sample_features(t, "flatten").shape == (2, 12)
    assert (feature_count((1, 3, 4), "mean"), feature_count((1, 6, 5, 5), "mean")) == (4, 6)
    assert (feature_count((1, 6, 5, 5), "flatten"), feature_count((7,), "flatten")) == (150, 0)
