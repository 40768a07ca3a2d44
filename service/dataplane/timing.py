"""How long a request will take, from the model's measured time per row, before any work.

Each model-running request states the rows it will push through the model (`Work`): plain
forwards, and rows whose forward keeps autograd's graph for a backward. Their times per row
were measured at load at the model's input size (`service.registry.row_times`); a request on
larger or smaller inputs is scaled by its sample's size. Those times come from one row, while
other models may be loading too, so they are corrected by what requests really took
(`Calibration`: the ratio of the time a request took to its estimate, learnt per model).
A request that cannot finish before its deadline (`request_timeout_s`) is refused at once
(422) with its estimate and what to change, rather than run until the deadline ends it with
a 504.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from service.errors import InvalidField
from service.registry.row_times import RowTimes


@dataclass(frozen=True)
class Work:
    """Rows a request pushes through the model: `forwards` in all (with or without autograd), `backwards` of
    them also differentiated; `advice` names the parameter that lowers them."""

    forwards: int
    backwards: int = 0
    advice: str = "send fewer inputs"
    lighter: tuple[tuple[str, Work], ...] = ()  # cheaper settings of the same request and their work, in turn


@dataclass(frozen=True)
class TimeEstimate:
    work: Work
    seconds: float  # 0 when the model's times were not measured
    deadline_s: float | None

    @property
    def in_time(self) -> bool:
        return self.deadline_s is None or self.seconds <= self.deadline_s

    def describe(self) -> str:
        return (
            f"{self.work.forwards:,} forwards"
            + (f" ({self.work.backwards:,} with a backward)" if self.work.backwards else "")
            + f" ≈ {self.seconds:.3g} s"
        )


def plain_forwards(x: torch.Tensor) -> Work:
    """One forward per input row (predictions, captures, attention)."""
    return Work(int(x.shape[0]))


def size_scale(x: torch.Tensor, input_size: list[int]) -> float:
    """How much larger the request's samples are than the input size the times were measured at."""
    measured = math.prod(input_size) if input_size else 1
    return math.prod(int(s) for s in x.shape[1:]) / max(1, measured)


def estimate_time(work: Work, times: RowTimes, scale: float, deadline_s: float | None) -> TimeEstimate:
    per_row = times.forward * scale
    seconds = work.forwards * per_row + work.backwards * times.backward * scale
    return TimeEstimate(work, seconds, deadline_s)


def check_time(found: TimeEstimate, times: RowTimes, scale: float) -> None:
    """A 422 for a request that cannot finish before its deadline, with the estimate and what would help: the
    first of its cheaper settings that would finish in time, when it has some."""
    if found.in_time:
        return
    advice = found.work.advice
    for said, work in found.work.lighter:
        cheaper = estimate_time(work, times, scale, found.deadline_s)
        if cheaper.in_time:
            advice += f" ({said} is {cheaper.describe()})"
            break
    raise InvalidField(
        f"this request is {found.describe()}, over the {found.deadline_s:g} s deadline (request_timeout_s); {advice}"
    )


MIN_OBSERVED_S = 0.25  # shorter requests say little about the model's speed (overheads dominate them)
FACTOR_BOUNDS = (0.05, 20.0)
WEIGHT = 0.5  # of the newest observation


class Calibration:
    """Per model, how much longer (or shorter) requests took than their estimate from the load-time
    measurement: a moving average of took / estimated over requests of at least `MIN_OBSERVED_S`, bounded by
    `FACTOR_BOUNDS`. The time from admission to the answer counts (waiting in the model's queue too, as the
    deadline does)."""

    def __init__(self) -> None:
        self._factors: dict[str, float] = {}

    def factor(self, model: str) -> float:
        return self._factors.get(model, 1.0)

    def observe(self, model: str, estimated_s: float, took_s: float) -> None:
        """One request of `model` estimated (uncorrected) at `estimated_s` took `took_s`."""
        if estimated_s < MIN_OBSERVED_S:
            return
        low, high = FACTOR_BOUNDS
        ratio = min(high, max(low, took_s / estimated_s))
        old = self._factors.get(model)
        self._factors[model] = ratio if old is None else (1 - WEIGHT) * old + WEIGHT * ratio


def rows_within(seconds: float, per_row_s: float, *, most: int, least: int = 1) -> int:
    """The most rows (between `least` and `most`) one forward may see to take about `seconds` at `per_row_s`."""
    if per_row_s <= 0:
        return most
    return max(least, min(most, int(seconds / per_row_s)))
