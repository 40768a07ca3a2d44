"""Linear CKA between layers, exact over a whole data set, from sums kept one chunk at a time.

Each layer's activations become one feature vector per sample (`mean`: each unit's mean over its
positions, as `units()` counts units; `flatten`: every value). For the layers' features side by side,
`z = [x_1 | x_2 | ...]`, the running count, sum and sum of outer products give the centred
cross-covariance `C = sum (z - m)(z - m)^T` of the whole set, block by block. Linear CKA (Kornblith
et al. 2019) of layers i and j is then

    CKA(i, j) = ||C_ij||_F^2 / (||C_ii||_F * ||C_jj||_F)

which is the textbook `HSIC(K, L) / sqrt(HSIC(K, K) HSIC(L, L))` with linear kernels on the full
`n x n` Gram matrices (`tr(K H L H) = ||X_c^T Y_c||_F^2`): exact, not a minibatch estimate, and
independent of the chunking. Sums are float64, of features shifted by the first chunk's mean, so
that large means do not cancel the covariance away.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from service.introspection.unit_stats import units

FeatureReduce = Literal["mean", "flatten"]


def sample_features(t: torch.Tensor, reduce: FeatureReduce) -> torch.Tensor:
    """`[N, features]` float64 of one layer's output: per-unit means over positions, or every value."""
    v = units(t)  # [N, U, P]
    return v.mean(dim=2) if reduce == "mean" else v.reshape(v.shape[0], -1)


def feature_count(shape: Sequence[int], reduce: FeatureReduce) -> int:
    """Features per sample of a layer output of `shape` (batch dimension first)."""
    if len(shape) < 2:
        return 0
    if reduce == "mean":
        return int(shape[-1] if len(shape) == 3 else shape[1])
    count = 1
    for size in shape[1:]:
        count *= int(size)
    return count


@dataclass
class CrossCovariance:
    """Count, sum and sum of outer products of shifted feature vectors `z - shift`, in float64."""

    count: torch.Tensor  # [] float64
    shift: torch.Tensor  # [F]
    total: torch.Tensor  # [F]
    products: torch.Tensor  # [F, F]

    @classmethod
    def first(cls, z: torch.Tensor) -> CrossCovariance:
        width = z.shape[1]
        found = cls(
            torch.zeros((), dtype=torch.float64),
            z.mean(dim=0),
            torch.zeros(width, dtype=torch.float64),
            torch.zeros(width, width, dtype=torch.float64),
        )
        found.update(z)
        return found

    def update(self, z: torch.Tensor) -> None:
        shifted = z - self.shift
        self.count += z.shape[0]
        self.total += shifted.sum(dim=0)
        self.products += shifted.T @ shifted

    def centred(self) -> torch.Tensor:
        """`sum (z - m)(z - m)^T` over every sample so far (m: their mean)."""
        return self.products - torch.outer(self.total, self.total) / self.count

    def state(self) -> dict[str, torch.Tensor]:
        return {"count": self.count, "shift": self.shift, "total": self.total, "products": self.products}

    @classmethod
    def from_state(cls, state: Mapping[str, torch.Tensor]) -> CrossCovariance:
        return cls(state["count"].clone(), state["shift"].clone(), state["total"].clone(), state["products"].clone())


def linear_cka(centred: torch.Tensor, widths: Sequence[int]) -> list[list[float | None]]:
    """CKA of every pair of the blocks of `centred` (consecutive widths); None where a layer is constant."""
    edges = [0]
    for width in widths:
        edges.append(edges[-1] + width)
    blocks = [slice(a, b) for a, b in itertools.pairwise(edges)]
    norms = [float(torch.linalg.matrix_norm(centred[b, b])) for b in blocks]
    matrix: list[list[float | None]] = [[None] * len(blocks) for _ in blocks]
    for i, bi in enumerate(blocks):
        for j in range(i, len(blocks)):
            denominator = norms[i] * norms[j]
            cross = float(torch.linalg.matrix_norm(centred[bi, blocks[j]]) ** 2)
            matrix[i][j] = matrix[j][i] = cross / denominator if denominator > 0 else None
    return matrix
