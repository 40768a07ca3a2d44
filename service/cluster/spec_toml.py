"""Model specs back into models-TOML text, so that each replica reads the subset it serves as a file.

A replica may run on another machine than the command that deployed it: it gets the text,
not a path. Values are JSON-shaped (strings, numbers, booleans, lists, tables); JSON's
string escapes, numbers and lists are valid TOML, and tables become inline tables. Fields
at their defaults are left out; TOML has no null, so a spec holding one where the default
is not null (only possible for a spec built in code) cannot be written.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any

from service.specs.model import ModelSpec


def _value(value: Any) -> str:
    if value is None:
        raise ValueError("TOML has no null")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, (str, int, float)):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        items = [f"{json.dumps(str(k))} = {_value(v)}" for k, v in value.items()]
        return "{" + ", ".join(items) + "}"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def specs_toml(specs: Iterable[ModelSpec]) -> str:
    """`[[models]]` entries that `load_specs` reads back into equal specs."""
    blocks = []
    for spec in specs:
        data = spec.model_dump(mode="json", exclude_defaults=True)
        try:
            lines = ["[[models]]", *(f"{json.dumps(k)} = {_value(v)}" for k, v in data.items())]
        except ValueError as exc:
            raise ValueError(f"model {spec.name!r} cannot be written as TOML: {exc}") from None
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"
