"""Latency percentiles, computed as numpy's default (linear interpolation) does."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Linear-interpolated percentile of sorted values (numpy's default method)."""
    if not sorted_values:
        return float("nan")
    k = (len(sorted_values) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def latency_summary(values_ms: Iterable[float]) -> dict[str, float]:
    lat = sorted(values_ms)
    mean = sum(lat) / len(lat) if lat else float("nan")
    top = lat[-1] if lat else float("nan")
    return {
        "mean": mean,
        "p50": percentile(lat, 50),
        "p95": percentile(lat, 95),
        "p99": percentile(lat, 99),
        "max": top,
    }
