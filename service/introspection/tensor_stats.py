"""Reductions and summary statistics of tensors (activations, state-dict entries)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from service.dtypes import dtype_name
from service.specs.vocab import Reduce

# Elements per chunk in finite_stats: bounds the float64 working copy (32 MiB) of huge tensors.
_CHUNK = 1 << 22
_SUMMARY_STATS = ("min", "max", "mean", "std", "zero_fraction")


def reduce_tensor(t: Tensor, reduce: Reduce | None) -> Tensor:
    """mean/max over every dim after the first two (`[N, C, ...] -> [N, C]`); flatten to `[N, -1]`.

    Tensors with no spatial dims (ndim <= 2) are returned unchanged by mean and max.
    """
    if reduce is None or t.ndim == 0:
        return t
    reduce = Reduce(reduce)  # a plain "mean" string works too
    if reduce is Reduce.flatten:
        return t.reshape(t.shape[0], -1)
    if t.ndim <= 2:
        return t
    dims = tuple(range(2, t.ndim))
    if reduce is Reduce.mean:
        return (t if t.is_floating_point() else t.double()).mean(dim=dims)
    if any(t.shape[d] == 0 for d in dims):  # max over nothing
        return torch.full(tuple(t.shape[:2]), math.nan, dtype=torch.float32, device=t.device)
    return t.amax(dim=dims)


def captured_stats(captured: Mapping[str, Mapping[str, Tensor]]) -> dict[str, dict[str, Any]]:
    """`tensor_summary` of every captured tensor, keyed as captured (`{key: {side: stats}}`)."""
    return {key: {side: tensor_summary(t) for side, t in sides.items()} for key, sides in captured.items()}


def tensor_summary(t: Tensor) -> dict[str, Any]:
    """shape, dtype, min, max, mean, std (population), zero_fraction over all elements, in float64.

    A statistic that is not a finite number (NaN/inf in the tensor, or no elements) is None.
    """
    out: dict[str, Any] = {"shape": list(t.shape), "dtype": dtype_name(t.dtype)}
    if t.numel() == 0:
        return out | dict.fromkeys(_SUMMARY_STATS)
    x = _as_float64(t.detach())
    values = torch.stack([x.min(), x.max(), x.mean(), x.std(correction=0), (x == 0).double().mean()]).tolist()
    return out | {k: _finite(v) for k, v in zip(_SUMMARY_STATS, values, strict=True)}


def finite_stats(t: Tensor) -> dict[str, Any]:
    """min, max, mean, std (population), L2 norm over the finite elements, plus nan/inf counts.

    Runs on the tensor's own device in float64 chunks (no copy of the whole tensor); the
    chunk moments are merged with Chan et al.'s pairwise update (1979, "Updating formulae
    and a pairwise algorithm for computing sample variances"). Values are None with no
    finite element.
    """
    flat = t.detach().reshape(-1)
    count, mean, m2, sumsq = 0, 0.0, 0.0, 0.0
    lo, hi = math.inf, -math.inf
    nans = infs = 0
    for start in range(0, flat.numel(), _CHUNK):
        x = _as_float64(flat[start : start + _CHUNK])
        finite = torch.isfinite(x)
        n_t = finite.sum()
        zero = torch.zeros((), dtype=torch.float64, device=x.device)
        kept = torch.where(finite, x, zero)
        mean_t = kept.sum() / n_t.clamp(min=1)
        centred = torch.where(finite, x - mean_t, zero)
        c_lo, c_hi, c_mean, c_m2, c_sumsq, c_n, c_nan, c_inf = torch.stack(
            [
                torch.where(finite, x, math.inf).amin(),
                torch.where(finite, x, -math.inf).amax(),
                mean_t,
                (centred * centred).sum(),
                (kept * kept).sum(),
                n_t.double(),
                torch.isnan(x).sum().double(),
                torch.isinf(x).sum().double(),
            ]
        ).tolist()
        nans += int(c_nan)
        infs += int(c_inf)
        n = int(c_n)
        if n == 0:
            continue
        total = count + n
        delta = c_mean - mean
        mean += delta * n / total
        m2 += c_m2 + delta * delta * count * n / total
        count = total
        sumsq += c_sumsq
        lo, hi = min(lo, c_lo), max(hi, c_hi)
    if count == 0:
        stats: dict[str, Any] = dict.fromkeys(("min", "max", "mean", "std", "norm"))
    else:
        stats = {
            "min": lo,
            "max": hi,
            "mean": mean,
            "std": math.sqrt(max(m2, 0.0) / count),
            "norm": math.sqrt(sumsq),
        }
    return stats | {"nan_count": nans, "inf_count": infs}


def _as_float64(t: Tensor) -> Tensor:
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.to(torch.float64)


def _finite(v: float) -> float | None:
    return v if math.isfinite(v) else None
