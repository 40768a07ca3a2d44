"""A model whose `__init__` hangs until the test opens its gate: a file next to the model's code.

`write_hanging(model_dir)` writes `hanging.py`; a spec passes `gate` relative to the model dir
(e.g. "./gate-1"), and `Gates` creates those files, every one of them on exit, so no load thread
is left waiting for a gate nobody opens.
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import Any

from tests.helpers.config import toml_value
from tests.helpers.models import WIDTH

HANGING_PY = '''\
"""`Hanging(gate)`: __init__ waits until the file `gate` (relative to this file) exists."""
import time
from pathlib import Path

import torch
from torch import nn


class Hanging(nn.Module):
    def __init__(self, gate: str, scale: float = 1.0, patience_s: float = 300.0) -> None:
        super().__init__()
        path = Path(__file__).parent / gate
        deadline = time.monotonic() + patience_s
        while not path.exists():
            if time.monotonic() > deadline:
                raise RuntimeError("the test never opened the gate")
            time.sleep(0.01)
        self.scale = nn.Parameter(torch.tensor(float(scale)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


class Exits(nn.Module):
    def __init__(self) -> None:
        raise SystemExit(3)
'''


def write_hanging(model_dir: Path) -> None:
    (model_dir / "hanging.py").write_text(HANGING_PY)


def hanging_spec(name: str, gate: str, scale: float = 1.0) -> dict[str, Any]:
    """The POST /models body of `Hanging` (samples of shape [WIDTH]) waiting for `gate`."""
    return {
        "name": name,
        "source": "python",
        "architecture": "hanging.py:Hanging",
        "input_size": [WIDTH],
        "kwargs": {"gate": gate, "scale": scale},
    }


def hanging_entry(name: str, gate: str, scale: float = 1.0) -> str:
    """The models TOML entry of `hanging_spec`."""
    body = "\n".join(f"{key} = {toml_value(value)}" for key, value in hanging_spec(name, gate, scale).items())
    return f"\n[[models]]\n{body}\n"


class Gates:
    """The gate files of one model dir; `with Gates(dir) as gates:` opens every gate it named on exit."""

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = model_dir
        self.named: list[str] = []

    def closed(self, name: str) -> str:
        """A gate not yet open: the kwarg to pass (relative to the model dir)."""
        self.named.append(name)
        return f"./{name}"

    def open(self, name: str) -> str:
        self.named.append(name)
        (self.model_dir / name).touch()
        return f"./{name}"

    def __enter__(self) -> Gates:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for name in self.named:
            (self.model_dir / name).touch()
