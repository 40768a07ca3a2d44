"""`dry_run`: a model-running request answered with what it would cost, without running anything.

The request is checked, decoded and costed as it would be for real; instead of being admitted
it answers 200 with its memory by part, the rows it would push through the model, the seconds
that would take, the rows per forward it would run in, and whether it would be admitted now
(or why not: the refusal it would get).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from service.dataplane.costs import Estimate
from service.dataplane.timing import TimeEstimate
from service.errors import HookserveError
from service.runtime.admission import MemoryBudget


class DryRunAnswer(Exception):  # not an error: it carries the 200 answer past the route
    """Raised by the data plane for a dry run: `report` is the answer's body (see `report`)."""

    def __init__(self, report: dict[str, Any]) -> None:
        super().__init__("dry run")
        self.report = report


def refusal(checks: list[Callable[[], None]]) -> str | None:
    """The first refusal the checks raise (its text), None when every check passes."""
    for check in checks:
        try:
            check()
        except HookserveError as exc:
            return f"{exc.status}: {exc.detail}"
    return None


def report(
    model: str,
    found: Estimate,
    time: TimeEstimate,
    budget: MemoryBudget,
    refused: str | None,
) -> dict[str, Any]:
    """The dry run's answer: memory, work, time, chunking and admission."""
    size = found.cost.total
    return {
        "dry_run": True,
        "model": model,
        "memory": {
            "bytes": size,
            "parts": dict(found.cost.parts),
            "limit_bytes": min(budget.per_request, budget.total),
            "in_use_bytes": budget.held(),
        },
        "forwards": time.work.forwards,
        "backwards": time.work.backwards,
        "seconds": round(time.seconds, 4),
        "deadline_s": time.deadline_s,
        "rows_per_forward": found.rows_per_forward,
        "admitted": refused is None,
        "would_wait": refused is None and budget.would_wait(size),
        "refusal": refused,
    }
