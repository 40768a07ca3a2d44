"""Hook lanes: copies of the served module that hooked work runs on, two batches at a time.

A hook registered on a module fires for every forward through it, so two hooked batches can
never share one module object. A lane is a copy of the module tree that shares every
parameter and buffer with the served module (no weights are copied: a lane costs the module
objects only) and has hook dicts of its own. Hooked batches on different lanes run at once,
each seeing only its own hooks; predictions never touch a lane, and `/layers`, summaries and
state dicts read the served module, which holds the very same tensors.
"""

from __future__ import annotations

import copy
import logging

import torch
from torch import nn

from service.errors import first_line

log = logging.getLogger("hookserve.loader")


def hook_lanes(module: nn.Module, count: int) -> tuple[nn.Module, ...]:
    """`count` copies of `module` sharing its parameters and buffers; () when it cannot be copied."""
    shared: dict[int, object] = {id(t): t for t in _tensors(module)}
    lanes: list[nn.Module] = []
    try:
        for _ in range(count):
            lanes.append(copy.deepcopy(module, memo=dict(shared)))
    except Exception as exc:  # a module holding something uncopyable (a lock, a handle) runs hooked work one at a time
        log.info("hooked work runs one batch at a time: the module cannot be copied (%s)", first_line(exc))
        return ()
    return tuple(lanes)


def _tensors(module: nn.Module) -> list[torch.Tensor]:
    return [*module.parameters(), *module.buffers()]
