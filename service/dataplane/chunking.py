"""Rows per forward chosen from the memory limit, so a request runs in chunks within it instead of being refused.

Methods that push many rows through the model (path integrals, noisy copies, perturbed copies)
hold memory for the rows of one forward at a time. Their estimate is linear in those rows, so
the most rows that fit under the per-request limit follow from the estimate at one and two
rows; the setting that bounds them (`ig_internal_batch_size`, `smoothgrad_batch_size`,
`perturbation_batch_size`) stays the most a forward sees. A request is refused (413) only when
its least chunk does not fit, and then the advice names what changes the estimate.
"""

from __future__ import annotations

from collections.abc import Callable

from service.dataplane.costs import Estimate
from service.runtime.admission import MemoryBudget


def request_limit(budget: MemoryBudget) -> int:
    """The most one request may hold: the per-request bound, or the whole budget when that is smaller."""
    return min(budget.per_request, budget.total)


def rows_that_fit(limit: int, fixed: int, per_row: int, *, most: int, least: int = 1) -> int:
    """The most rows, between `least` and `most`, with `fixed + rows * per_row <= limit` (`least` when none do)."""
    if per_row <= 0:
        return max(least, most)
    return max(least, min(most, (limit - fixed) // per_row))


def fitted(estimate_at: Callable[[int], Estimate], limit: int, *, most: int, least: int = 1) -> Estimate:
    """The estimate at the most rows per forward (`least`..`most`) that fit `limit`, with those rows recorded."""
    low = estimate_at(least)
    if most <= least:
        return low
    per_row = estimate_at(least + 1).cost.total - low.cost.total
    rows = rows_that_fit(limit, low.cost.total - least * per_row, per_row, most=most, least=least)
    return estimate_at(rows)
