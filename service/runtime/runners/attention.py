"""Attention probabilities of several requests from one hooked forward over their concatenated inputs.

The lane's chosen attention modules run unfused for this batch only (restored in `finally`, also when
the forward fails), hooks on their `attn_drop` keep the probabilities of the union of the requests'
query rows, and each request takes its own rows, heads and queries: the answer it would get alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from service.introspection.attention import AttentionModules, record_probabilities, unfused
from service.introspection.hooks import HookScope
from service.introspection.tokens import QuerySelection, query_rows, token_layout
from service.registry.loaded import LoadedModel
from service.runtime.batching import forward_checked, split_output, to_cpu, to_device
from service.runtime.runners.base import Runner, concatenated, offsets


@dataclass(frozen=True)
class AttentionRequest:
    sites: tuple[str, ...]  # attention module paths
    heads: tuple[int, ...] | None  # None: every head
    queries: QuerySelection  # query rows (`query_rows` resolves them for the batch's input size)


@dataclass
class AttentionResult:
    probabilities: dict[str, Tensor]  # key (`name`, `name#2`) -> [n, heads, queries, T] on the CPU
    output: Any  # this request's rows of the model's output, on the CPU


class AttentionRunner(Runner[AttentionRequest]):
    name = "attention"
    hooked = True

    def run(self, model: LoadedModel, inputs: Sequence[Tensor], requests: Sequence[AttentionRequest]) -> list[Any]:
        found: AttentionModules = model.attention
        names = list(dict.fromkeys(site for request in requests for site in request.sites))
        wanted = [found.sites[name] for name in names]
        layout = token_layout(model.module, tuple(inputs[0].shape[1:]))
        wanted_rows = [query_rows(request.queries, layout, None) for request in requests]
        rows = _query_union(wanted_rows)
        kept: dict[str, Tensor] = {}
        site_of: dict[str, str] = {}

        def keep(key: str, probabilities: Tensor) -> None:
            chosen = probabilities if rows is None else probabilities[:, :, list(rows)]
            kept[key] = chosen.detach().to("cpu", copy=True)
            site_of[key] = key.split("#", maxsplit=1)[0]

        x = to_device(concatenated(inputs), model)
        with unfused(model.module, names), HookScope(model.module) as scope, torch.inference_mode():
            record_probabilities(scope, model.module, wanted, keep)
            output = forward_checked(model, x)
        bounds = offsets(inputs)
        outputs = [to_cpu(output)] if len(inputs) == 1 else split_output(to_cpu(output), [b - a for a, b in bounds])
        answers: list[Any] = []
        for request, queries, (start, stop), out in zip(requests, wanted_rows, bounds, outputs, strict=True):
            mine = set(request.sites)
            position = {row: i for i, row in enumerate(rows)} if rows is not None else None
            own: dict[str, Tensor] = {}
            for key, t in kept.items():
                if site_of[key] not in mine:
                    continue
                part = t[start:stop]
                if request.heads is not None:
                    part = part[:, list(request.heads)]
                if queries is not None:
                    picks = queries if position is None else [position[q] for q in queries]
                    part = part[:, :, list(picks)]
                own[key] = part.contiguous()
            answers.append(AttentionResult(own, out))
        return answers


def _query_union(wanted: Sequence[list[int] | None]) -> tuple[int, ...] | None:
    """The query rows any request asks for (None: some request wants every row)."""
    if any(rows is None for rows in wanted):
        return None
    return tuple(sorted({q for rows in wanted for q in rows or ()}))


ATTENTION = AttentionRunner()
