"""Models TOML entries for the toy models of `tests.helpers.models`."""

from __future__ import annotations

import json
from typing import Any

from tests.helpers.models import WIDTH


def toml_value(value: Any) -> str:
    """A TOML literal for a str, bool, int, float, list or dict (an inline table)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"no TOML literal for {value!r}")


def toy_entry(name: str, cls: str, **fields: Any) -> str:
    """A `[[models]]` entry serving `tests.helpers.models:<cls>` on samples of shape [WIDTH]."""
    spec: dict[str, Any] = {
        "name": name,
        "source": "python",
        "architecture": f"tests.helpers.models:{cls}",
        "input_size": [WIDTH],
        **fields,
    }
    body = "\n".join(f"{key} = {toml_value(value)}" for key, value in spec.items())
    return f"\n[[models]]\n{body}\n"
