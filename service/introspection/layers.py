"""The module tree of a model, and turning user-given layer names and patterns into module paths."""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn
from torch.nn.parameter import is_lazy

from service.errors import InvalidField

_WILDCARDS = frozenset("*?[")


@dataclass(frozen=True)
class LayerNode:
    """One entry of `/layers`: a module path, its class, nesting depth, subtree parameters, children."""

    name: str
    type: str
    depth: int
    num_parameters: int
    children: list[str]


def layer_tree(model: nn.Module) -> list[LayerNode]:
    """Every named submodule in `named_modules()` order; the root is `""` at depth 0."""
    named = list(model.named_modules(remove_duplicate=True))
    names = {name for name, _ in named}
    nodes = []
    for name, module in named:
        children = [_join(name, child) for child, _ in module.named_children()]
        nodes.append(
            LayerNode(
                name=name,
                type=type(module).__name__,
                depth=_depth(name),
                num_parameters=sum(p.numel() for p in module.parameters() if not is_lazy(p)),
                children=[child for child in children if child in names],
            )
        )
    return nodes


_MAX_PROBLEMS = 10


def module_names(model: nn.Module) -> list[str]:
    """Every module path in `named_modules()` order (the root is `""`); computed once per loaded model."""
    return [name for name, _ in model.named_modules(remove_duplicate=True)]


def resolve_layers(names: Sequence[str], patterns: Sequence[str], max_layers: int) -> list[str]:
    """Module paths named by exact names or fnmatch patterns, in `names`' order, deduplicated.

    `names` are the model's module paths (`module_names`), so no model is read to resolve them.

    A pattern never matches the root; only the exact name `""` does. Unknown names, empty
    matches, an empty list and more than `max_layers` results are InvalidField (422).
    """
    return resolve_names(names, patterns, max_layers, field="layers", noun="layer", listing="layers")


def resolve_names(
    names: Sequence[str], patterns: Sequence[str], limit: int, *, field: str, noun: str, listing: str
) -> list[str]:
    """`resolve_layers` for any list of names (module paths, FX nodes); errors name `field`, `noun`
    and the `GET /models/{name}/<listing>` that lists the names."""
    if not patterns:
        raise InvalidField(f"{field}: name at least one {noun} (GET /models/{{name}}/{listing} lists them)")
    if len(patterns) > limit:  # refuse floods before any matching work
        raise InvalidField(f"{field}: {len(patterns)} names given, more than the limit of {limit} (max_layers)")
    known = set(names)
    chosen: set[str] = set()
    problems = []
    for pattern in patterns:
        if _WILDCARDS.intersection(pattern):
            found = {name for name in names if name and fnmatch.fnmatchcase(name, pattern)}
            if not found:
                problems.append(f"pattern {pattern!r} matches no {noun}{_hint(pattern, names)}")
            chosen |= found
        elif pattern in known:
            chosen.add(pattern)
        else:
            problems.append(f"unknown {noun} {pattern!r}{_hint(pattern, names)}")
    if problems:
        shown = problems[:_MAX_PROBLEMS] + (
            [f"and {len(problems) - _MAX_PROBLEMS} more"] if len(problems) > _MAX_PROBLEMS else []
        )
        raise InvalidField("; ".join(shown) + f" (GET /models/{{name}}/{listing} lists them)")
    if len(chosen) > limit:
        raise InvalidField(
            f"{field}: {len(chosen)} {noun}s match, more than the limit of {limit}; "
            f"name fewer {noun}s or use narrower patterns"
        )
    return [name for name in names if name in chosen]


def closest_names(name: str, names: Sequence[str], n: int = 5) -> list[str]:
    """Up to `n` names like `name`: difflib's closest, else those sharing the longest prefix with it."""
    candidates = [c for c in names if c]
    close = difflib.get_close_matches(name, candidates, n=n, cutoff=0.6)
    if close:
        return close
    for size in range(len(name), 0, -1):
        prefixed = [c for c in candidates if c.startswith(name[:size])]
        if prefixed:
            return prefixed[:n]
    return [c for c in candidates if "." not in c][:n]


def last_conv2d(model: nn.Module) -> str | None:
    """Name of the last `nn.Conv2d` in `named_modules()` order (Grad-CAM's default layer)."""
    found = None
    for name, module in model.named_modules():
        if isinstance(module, nn.Conv2d):
            found = name
    return found


def _hint(name: str, names: Sequence[str]) -> str:
    close = closest_names(name, names)
    return f"; closest: {', '.join(repr(c) for c in close)}" if close else ""


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _depth(name: str) -> int:
    return name.count(".") + 1 if name else 0
