"""A runner: one kind of batchable work, run over the concatenated inputs of several requests."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, ClassVar, Generic, TypeVar

import torch

from service.registry.loaded import LoadedModel

R = TypeVar("R")


class NotSplittable(Exception):
    """A batched tensor has no batch dimension to split by request: the requests run alone instead."""


class Runner(Generic[R]):
    """`R` is what one request asks (beyond its inputs); `run` answers every request of a batch.

    `run` returns one entry per request, the answer or the exception that request alone gets;
    an exception it raises fails the batch, and the executor then runs each request alone, so
    one request's failure never decides another's answer.
    """

    name: ClassVar[str]
    hooked: ClassVar[bool]  # registers hooks: runs on a hook lane (or alone on the eager module when there is none)

    def key(self, request: R) -> Hashable:
        """Requests with equal keys (and equal sample shapes) may share one batch."""
        return ()

    def short(self, request: R) -> bool:
        """One forward (and backward) at most: alone, it may take every core."""
        return True

    def run(self, model: LoadedModel, inputs: Sequence[torch.Tensor], requests: Sequence[R]) -> list[Any]:
        raise NotImplementedError


def offsets(inputs: Sequence[torch.Tensor]) -> list[tuple[int, int]]:
    """Each request's rows `[start, stop)` in the concatenated batch."""
    bounds, start = [], 0
    for x in inputs:
        bounds.append((start, start + int(x.shape[0])))
        start += int(x.shape[0])
    return bounds


def rows(t: torch.Tensor, bounds: tuple[int, int], total: int) -> torch.Tensor:
    """A request's rows of a batched tensor; NotSplittable when its first dimension is not the batch."""
    if t.ndim == 0 or t.shape[0] != total:
        raise NotSplittable(f"a tensor of shape {list(t.shape)} has no batch dimension of {total}")
    return t[bounds[0] : bounds[1]]


def concatenated(inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    return inputs[0] if len(inputs) == 1 else torch.cat(list(inputs))
