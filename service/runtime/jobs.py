"""The kinds of jobs, as metrics name them."""

from __future__ import annotations

from enum import StrEnum


class JobKind(StrEnum):
    predict = "predict"  # a batch of plain forwards (the prediction path)
    exclusive = "exclusive"  # holds the eager module alone: hooked batches, summaries
    shared = "shared"  # reads parameters or metadata beside everything else
