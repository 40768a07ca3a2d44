"""Toy models for tests, importable by the server as `tests.helpers.models:<Class>` (source = "python").

Every answer is exact in float32 (small integers in, integer arithmetic out), so a test can
compare with `==`, and rows are independent, so a batch's answer must equal each request's
answer run alone. `Gated` waits on a `Gate` the test holds: it keeps the model busy for as
long as the test wants, without timing.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

WIDTH = 4  # every toy model here takes samples of shape [WIDTH]
HOLD = -1000.0  # a sample whose first value is HOLD makes `Gated` wait for its gate
GATE_TIMEOUT_S = 60.0  # a gate nobody opens fails the forward instead of hanging the suite


@dataclass
class Gate:
    """What a test and its `Gated` model share: `entered` once a held batch is running, `opened` to let it go."""

    entered: threading.Event = field(default_factory=threading.Event)
    opened: threading.Event = field(default_factory=threading.Event)
    batch_sizes: list[int] = field(default_factory=list)  # every forward's batch size, warm-up included


GATES: dict[str, Gate] = {}


def new_gate() -> tuple[str, Gate]:
    """A fresh gate and its key (pass the key as the model's `gate` kwarg)."""
    key = uuid.uuid4().hex
    GATES[key] = gate = Gate()
    return key, gate


def rows(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The three per-row answers of `Gated`: `2x + 1` [N, 4], the row sum [N, 1], `-x[:, :2]` [N, 2]."""
    return x * 2 + 1, x.sum(dim=1, keepdim=True), -x[:, :2]


class Gated(nn.Module):
    """Rows in, `rows(x)` out in the shape `kind` says; a batch holding a HOLD sample waits for the gate.

    kind: "tensor" (`2x + 1` alone: class scores), "tuple", "list", "dict", or "nested" (a tuple
    holding a dict holding a list).
    """

    def __init__(self, gate: str, kind: str = "tensor") -> None:
        super().__init__()
        self.gate = GATES[gate]
        self.kind = kind
        self.scale = nn.Parameter(torch.ones(()))  # a parameter, so the model has a dtype and a device
        self.body = nn.Identity()  # a layer for /activations to hook

    def forward(self, x: Tensor) -> Any:
        x = self.body(x)
        self.gate.batch_sizes.append(int(x.shape[0]))
        if bool((x[:, 0] == HOLD).any()):
            self.gate.entered.set()
            if not self.gate.opened.wait(GATE_TIMEOUT_S):
                raise RuntimeError("the test never opened the gate")
        a, b, c = rows(x * self.scale)
        if self.kind == "tensor":
            return a
        if self.kind == "tuple":
            return a, b, c
        if self.kind == "list":
            return [a, b, c]
        if self.kind == "dict":
            return {"a": a, "b": b, "c": c}
        return a, {"b": b, "c": [c]}


class FileGated(nn.Module):
    """`Gated` for a server in another process: the gate is a path the test passes as the `gate` kwarg.

    A batch holding a HOLD sample creates `<gate>.entered`, then waits until `<gate>.open`
    exists (or `timeout_s` passes: then the forward fails). The answer is `2x + 1`.
    """

    def __init__(self, gate: str, timeout_s: float = 600.0) -> None:
        super().__init__()
        self.entered = Path(f"{gate}.entered")
        self.open = Path(f"{gate}.open")
        self.timeout_s = timeout_s
        self.scale = nn.Parameter(torch.ones(()))
        self.body = nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        x = self.body(x)
        if bool((x[:, 0] == HOLD).any()):
            self.entered.touch()
            deadline = time.monotonic() + self.timeout_s
            while not self.open.exists():
                if time.monotonic() > deadline:
                    raise RuntimeError("the test never opened the gate")
                time.sleep(0.01)
        return x * self.scale * 2 + 1


# One constant row per dtype an answer can carry, at the edges of each type's range.
CONSTANTS: dict[torch.dtype, list[Any]] = {
    torch.bool: [True, False, True],
    torch.uint8: [0, 1, 200, 255],
    torch.uint16: [0, 1, 40000, 65535],
    torch.uint32: [0, 1, 3_000_000_000, 2**32 - 1],
    torch.uint64: [0, 1, 2**63 + 5, 2**64 - 1],
    torch.int8: [-128, -1, 0, 127],
    torch.int16: [-32768, -1, 0, 32767],
    torch.int32: [-(2**31), -1, 0, 2**31 - 1],
    torch.int64: [-(2**63), -1, 0, 2**63 - 1],
    torch.float16: [0.1, -2.5e-3, 65504.0, 6e-8],
    torch.float32: [0.1, -2.5e-3, 3.0e38, 1e-45],
    torch.float64: [0.1, -2.5e-3, 1e300, 5e-324],
    torch.bfloat16: [0.1, -2.5e-3, 3.0e38, 1.00390625],
}


class Constants(nn.Module):
    """One output per dtype of CONSTANTS, in its order: that dtype's constant row for every sample."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, x: Tensor) -> tuple[Tensor, ...]:
        n = x.shape[0]
        return tuple(torch.tensor(values, dtype=dtype).repeat(n, 1) for dtype, values in CONSTANTS.items())


class Echo(nn.Module):
    """Its input, times a parameter of 1 (so the answer has the model's dtype)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.scale


class Affine(nn.Module):
    """`fc`: 4 -> 3 with hand-set integer weights, then `out`: an identity the activations tests can read."""

    WEIGHT = ((1.0, 0.0, -1.0, 2.0), (0.5, 1.0, 0.0, -1.0), (0.0, -2.0, 1.0, 0.25))
    BIAS = (0.5, -1.0, 0.0)

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, 3)
        with torch.no_grad():
            self.fc.weight.copy_(torch.tensor(self.WEIGHT))
            self.fc.bias.copy_(torch.tensor(self.BIAS))
        self.out = nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        return self.out(self.fc(x))  # type: ignore[no-any-return]


class PartlyFrozen(nn.Module):
    """A frozen 4 -> 3 backbone (15 parameters) under a trainable 3 -> 2 head (8 parameters)."""

    FROZEN = 15
    TRAINABLE = 8

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Linear(WIDTH, 3)
        self.head = nn.Linear(3, 2)
        self.backbone.requires_grad_(False)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.backbone(x))  # type: ignore[no-any-return]


class Nest(nn.Module):
    """Re-entrant: `nest(x, depth)` calls itself on `x + 1` before it returns, so its calls nest."""

    def forward(self, x: Tensor, depth: int = 2) -> Tensor:
        if depth > 0:
            x = self(x + 1, depth - 1)
        return x * 2


class Reentrant(nn.Module):
    """Three nested calls of one `nest` module: `nest` (outermost) is 8(x + 2), `nest#2` 4(x + 2), `nest#3` 2(x + 2).

    The calls begin outermost first and end innermost first, so the call numbers must follow
    the beginnings, not the ends.
    """

    def __init__(self) -> None:
        super().__init__()
        self.nest = Nest()
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, x: Tensor) -> Tensor:
        return self.nest(x * self.scale)  # type: ignore[no-any-return]


class FromFile(nn.Module):
    """Adds the number written in the text file `offset_file` (a path kwarg, as timm's `checkpoint_path`)."""

    def __init__(self, offset_file: str, options: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.offset = nn.Parameter(torch.tensor(float(Path(offset_file).read_text())))
        self.options = options or {}

    def forward(self, x: Tensor) -> Tensor:
        return x + self.offset
