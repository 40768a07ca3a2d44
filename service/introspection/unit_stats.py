"""Streaming reductions of a layer's activations over a data set, one chunk at a time.

A *unit* is a channel of a feature map (`[N, C, H, W]` or `[N, C]`) or the last dimension of a
token sequence (`[N, T, D]`); its values are every position of every sample. `UnitStats` keeps,
per unit, the count, mean and sum of squared deviations (combined across chunks by Chan, Golub and
LeVeque's pairwise update of Welford's algorithm, in float64, so the result is exact up to
rounding whatever the chunking), the max, the count of positive values and a histogram.
`Exemplars` keeps, per unit, the k samples with the highest score (the unit's max or mean over
positions in that sample), ties going to the earlier sample.

Both hold only tensors (`state()` / `from_state()`), so a job checkpoints and resumes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

Score = Literal["max", "mean"]


def units(t: torch.Tensor) -> torch.Tensor:
    """`t` as `[N, units, positions]` float64: channels for rank 2 and 4+, the last dimension for rank 3."""
    if t.ndim < 2:
        raise ValueError(f"a tensor of shape {list(t.shape)} has no unit dimension")
    t = t.detach().to("cpu", torch.float64)
    if t.ndim == 3:  # [N, T, D]: token dimension D
        return t.transpose(1, 2)
    return t.reshape(t.shape[0], t.shape[1], -1)


@dataclass
class UnitStats:
    """Per-unit mean, std (population), max, fraction positive and histogram over `bins` buckets of [lo, hi].

    Values below `lo` or above `hi` are counted apart (`under`, `over`). A range not given is the first
    chunk's min and max over the whole layer.
    """

    bins: int
    count: torch.Tensor  # [U] float64
    mean: torch.Tensor
    m2: torch.Tensor
    peak: torch.Tensor
    positive: torch.Tensor
    hist: torch.Tensor  # [U, bins + 2]: under, bins..., over
    bounds: torch.Tensor  # [2]: lo, hi

    @classmethod
    def first(cls, chunk: torch.Tensor, bins: int, value_range: tuple[float, float] | None = None) -> UnitStats:
        v = units(chunk)
        if value_range is None:
            lo, hi = float(v.min()), float(v.max())
            if hi <= lo:
                hi = lo + 1.0
        else:
            lo, hi = value_range
        u = v.shape[1]
        zeros = torch.zeros(u, dtype=torch.float64)
        stats = cls(
            bins,
            zeros.clone(),
            zeros.clone(),
            zeros.clone(),
            torch.full((u,), float("-inf"), dtype=torch.float64),
            zeros.clone(),
            torch.zeros(u, bins + 2, dtype=torch.float64),
            torch.tensor([lo, hi], dtype=torch.float64),
        )
        stats.update(chunk)
        return stats

    def update(self, chunk: torch.Tensor) -> None:
        v = units(chunk)
        u = v.shape[1]
        if u != self.count.shape[0]:
            raise ValueError(f"a chunk with {u} units, not {self.count.shape[0]}")
        flat = v.transpose(0, 1).reshape(u, -1)  # [U, values]
        n_b = float(flat.shape[1])
        mean_b = flat.mean(dim=1)
        m2_b = ((flat - mean_b[:, None]) ** 2).sum(dim=1)
        n_a = self.count
        n = n_a + n_b
        delta = mean_b - self.mean
        self.mean = self.mean + delta * (n_b / n)
        self.m2 = self.m2 + m2_b + delta**2 * (n_a * n_b / n)
        self.count = n
        self.peak = torch.maximum(self.peak, flat.max(dim=1).values)
        self.positive += (flat > 0).sum(dim=1).to(torch.float64)
        self.hist += _histogram(flat, self.bins, float(self.bounds[0]), float(self.bounds[1]))

    def result(self) -> dict[str, Any]:
        """Plain lists per unit, for JSON."""
        lo, hi = float(self.bounds[0]), float(self.bounds[1])
        return {
            "units": int(self.count.shape[0]),
            "count": int(self.count[0]) if self.count.numel() else 0,
            "mean": self.mean.tolist(),
            "std": (self.m2 / self.count).sqrt().tolist(),
            "max": self.peak.tolist(),
            "fraction_positive": (self.positive / self.count).tolist(),
            "histogram": {
                "edges": torch.linspace(lo, hi, self.bins + 1, dtype=torch.float64).tolist(),
                "counts": self.hist[:, 1:-1].to(torch.int64).tolist(),
                "under": self.hist[:, 0].to(torch.int64).tolist(),
                "over": self.hist[:, -1].to(torch.int64).tolist(),
            },
        }

    def state(self) -> dict[str, torch.Tensor]:
        return {
            "count": self.count,
            "mean": self.mean,
            "m2": self.m2,
            "max": self.peak,
            "positive": self.positive,
            "hist": self.hist,
            "range": self.bounds,
        }

    @classmethod
    def from_state(cls, state: dict[str, torch.Tensor]) -> UnitStats:
        hist = state["hist"]
        return cls(
            int(hist.shape[1]) - 2,
            state["count"],
            state["mean"],
            state["m2"],
            state["max"],
            state["positive"],
            hist,
            state["range"],
        )


def _histogram(flat: torch.Tensor, bins: int, lo: float, hi: float) -> torch.Tensor:
    """`[U, bins + 2]` counts of each row's values: below `lo`, `bins` equal buckets of [lo, hi], above `hi`."""
    u = flat.shape[0]
    bucket = torch.floor((flat - lo) / (hi - lo) * bins).clamp_(-1, bins)
    bucket[flat == hi] = bins - 1  # the last bucket is closed on the right
    bucket[flat > hi] = bins
    index = (torch.arange(u)[:, None] * (bins + 2) + bucket.to(torch.int64) + 1).reshape(-1)
    return torch.bincount(index, minlength=u * (bins + 2)).reshape(u, bins + 2).to(torch.float64)


@dataclass
class Exemplars:
    """Per unit, the `k` samples (by data-set index) with the highest score, best first."""

    k: int
    score: Score
    scores: torch.Tensor  # [U, <=k] float64
    indices: torch.Tensor  # [U, <=k] int64

    @classmethod
    def empty(cls, k: int, score: Score) -> Exemplars:
        return cls(k, score, torch.zeros(0, 0, dtype=torch.float64), torch.zeros(0, 0, dtype=torch.int64))

    def update(self, chunk: torch.Tensor, indices: torch.Tensor) -> None:
        """Fold in a chunk whose rows are the data-set samples `indices` (increasing, after every index seen)."""
        v = units(chunk)
        per_sample = v.amax(dim=2) if self.score == "max" else v.mean(dim=2)  # [N, U]
        new_scores = per_sample.transpose(0, 1)  # [U, N]
        new_indices = indices.to(torch.int64)[None, :].expand_as(new_scores)
        if self.scores.numel():
            new_scores = torch.cat([self.scores, new_scores], dim=1)
            new_indices = torch.cat([self.indices, new_indices], dim=1)
        # ties go to the earlier sample: order by index, then a stable sort by score
        by_index = new_indices.argsort(dim=1, stable=True)
        new_scores, new_indices = new_scores.gather(1, by_index), new_indices.gather(1, by_index)
        order = new_scores.argsort(dim=1, descending=True, stable=True)[:, : self.k]
        self.scores, self.indices = new_scores.gather(1, order), new_indices.gather(1, order)

    def state(self) -> dict[str, torch.Tensor]:
        return {"scores": self.scores, "indices": self.indices}

    @classmethod
    def from_state(cls, k: int, score: Score, state: dict[str, torch.Tensor]) -> Exemplars:
        return cls(k, score, state["scores"], state["indices"])
