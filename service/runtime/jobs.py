"""The kinds of jobs, as metrics name them."""

from __future__ import annotations

from enum import StrEnum


class JobKind(StrEnum):
    predict = "predict"  # a batch of plain forwards (the prediction path)
    exclusive = "exclusive"  # hooked batches (on a lane, or the eager module alone) and summaries
    shared = "shared"  # reads parameters or metadata beside everything else
