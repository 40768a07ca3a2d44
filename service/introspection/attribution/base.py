"""What every attribution method shares: its parameters, its limits, attribute, heatmap.

A method is one module in this package: a `MethodParams` subclass naming its own fields
(the /saliency request is the union of every method's parameters, discriminated by
`method`), and an `AttributionMethod` subclass registered with `@register_method`. The
runner (`run.py`) resolves targets, calls `attribute` and turns each row into a
`SaliencyItem` with the method's heatmap.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

import torch
from pydantic import BaseModel, ConfigDict
from torch import Tensor, nn

from service.config import Settings
from service.errors import InvalidField
from service.introspection.tokens import TokenLayout


class MethodParams(BaseModel):
    """A method's own request fields; subclasses add `method: Literal["<name>"]` and their parameters."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    method: str


P = TypeVar("P", bound=MethodParams)


@dataclass(frozen=True)
class SaliencyItem:
    """One input's attribution (its own shape, no batch dim) and its `[H, W]` heatmap in [0, 1]."""

    target: int
    score: float
    probability: float
    attribution: Tensor
    heatmap: Tensor
    convergence_delta: float | None = None
    tokens: TokenLayout | None = None  # the map is over the patch grid of these tokens (prefix tokens left out)


@dataclass
class Attributions:
    """`attribute`'s answer: one row per input, and Integrated Gradients' convergence deltas."""

    rows: Tensor
    deltas: list[float] | None = None
    tokens: TokenLayout | None = None  # the rows were made from a token layer's patch tokens on this grid


@dataclass(frozen=True)
class AttributionContext:
    """What a method may need besides the model and inputs: the memory bounds, the scores already computed."""

    settings: Settings
    logits: Tensor  # the model's class scores for the inputs
    rows: int | None = None  # rows one forward may see, chosen to fit the memory limit (None: the method's setting)

    def rows_per_forward(self, setting: int) -> int:
        """The rows chosen for this batch, else `setting` (the method's configured bound)."""
        return self.rows if self.rows is not None else setting


INPUT = ""
"""`graph_from`'s answer for methods that differentiate with respect to the input itself."""


class AttributionMethod(Generic[P]):
    """One attribution method (one module of this package).

    A method either differentiates the target scores once with respect to one tensor (the
    input, or a layer's output: `graph_from` names it and `from_graph` turns the tensor and its
    gradient into attribution rows; autograd then runs only downstream of that tensor), or it
    runs its own forwards (`attribute`, e.g. Captum's noise tunnels and path integrals).
    """

    name: ClassVar[str]
    params: ClassVar[type[MethodParams]]
    title: ClassVar[str]  # for the OpenAPI page: the method and its paper
    over_tokens: ClassVar[bool] = False  # the map is over a vision transformer's patch grid by design
    chunked: ClassVar[bool] = False  # `attribute` runs its rows in chunks of `AttributionContext.rows`
    least_rows: ClassVar[int] = 1  # the fewest rows one of its forwards can see
    # its forwards need neither autograd nor hooks (perturbations): they may run on the prediction path's copy
    # (ONNX Runtime, the fused or compiled module), which loading checked against the model
    plain_forwards: ClassVar[bool] = False
    time_advice: ClassVar[str] = "send fewer inputs"  # what lowers its rows through the model

    def check_model(self, params: P, model: nn.Module, name: str) -> None:
        """Refuse a model the method cannot explain (a 422 naming why), before any work (nothing by default)."""

    def check_limits(self, params: P, settings: Settings) -> None:
        """Refuse parameters over a configured limit, before any work (nothing to check by default)."""

    def check_input(self, params: P, shape: tuple[int, ...], settings: Settings) -> None:
        """Refuse parameters that do not fit inputs of `shape` (one sample, no batch dim) or whose cost on such
        inputs is over a configured limit: after decoding, before any model work (nothing to check by default)."""

    def resolve_layers(self, params: P, names: Sequence[str]) -> P:
        """`params` with its layer names resolved against the model's module paths `names` (a 422 for
        a name the model lacks), before any work. Methods that name no layer return `params`."""
        return params

    def batch_key(self, params: P) -> Hashable:
        """Requests whose keys are equal can share one batch; the parameters that must then agree."""
        return ()

    @property
    def many_forwards(self) -> bool:
        """The method runs forwards of its own (`attribute`) rather than differentiating one graph."""
        return type(self).graph_from is AttributionMethod.graph_from

    def chunk(self, params: P, settings: Settings) -> int | None:
        """How many rows (inputs, or their noisy, perturbed or interpolated copies) one forward and backward
        of `attribute` sees at most, for its memory estimate; None: the whole batch at once."""
        return None

    def rows_per_input(self, params: P) -> int | None:
        """How many rows each input becomes inside `attribute` (interpolation steps, say), when a forward can
        see fewer than `chunk` of them: the estimate then counts min(chunk, inputs x rows). None: unknown."""
        return None

    def rows_through(self, params: P, shape: tuple[int, ...]) -> tuple[int, int]:
        """(forwards, of them differentiated) rows each input of `shape` pushes through the model, for the time
        estimate: one forward and its backward by default."""
        return 1, 1

    def lighter(self, params: P, shape: tuple[int, ...]) -> tuple[P, str] | None:
        """A cheaper setting of `params` on inputs of `shape` and how to say it ("steps 25"), for the advice of a
        request past its deadline; None when there is none (by default)."""
        return None

    def graph_from(self, params: P, model: nn.Module) -> str | None:
        """`INPUT`, a layer name, or None when `attribute` runs the method's own forwards."""
        return None

    def from_graph(self, kept: Sequence[Tensor], grads: Sequence[Tensor], params: P, x: Tensor) -> Tensor:
        """Attribution rows from the tensor(s) `graph_from` named and their gradients."""
        raise NotImplementedError(f"{self.name} runs its own forwards")

    def attribute(
        self, model: nn.Module, x: Tensor, targets: list[int], params: Sequence[P], ctx: AttributionContext
    ) -> Attributions:
        """Attribution rows for `targets[i]` of each input `x[i]` with `params[i]` (`x` requires grad)."""
        raise NotImplementedError(f"{self.name} differentiates one graph (graph_from)")

    def heatmap(self, row: Tensor, x: Tensor) -> Tensor:
        """An input-sized `[H, W]` map of one attribution row (min-max scaled by the runner)."""
        return input_space_map(row)

    def attribution_row(self, row: Tensor) -> Tensor:
        """The attribution of one input as answered (the row itself by default)."""
        return row


_METHODS: dict[str, AttributionMethod[Any]] = {}


def register_method(cls: type[AttributionMethod[P]]) -> type[AttributionMethod[P]]:
    """Make `cls` available to /saliency under `cls.name`; a name registered twice is an error."""
    if cls.name in _METHODS:
        raise ValueError(f"attribution method {cls.name!r} is registered twice")
    _METHODS[cls.name] = cls()
    return cls


def registered_methods() -> dict[str, AttributionMethod[Any]]:
    return dict(_METHODS)


def method_named(name: str) -> AttributionMethod[Any]:
    method = _METHODS.get(name)
    if method is None:
        raise InvalidField(f"unknown saliency method {name!r}; choose one of {', '.join(_METHODS)}")
    return method


def input_space_map(attribution: Tensor) -> Tensor:
    """Max over channels of |attribution| for `[C, H, W]`; `|a|` for `[H, W]`; `[1, L]` for `[L]`."""
    magnitude = attribution.float().abs()
    if magnitude.dim() >= 3:
        return magnitude.reshape(-1, *magnitude.shape[-2:]).amax(dim=0)
    if magnitude.dim() == 2:
        return magnitude
    return magnitude.reshape(1, -1)


def halved(params: P, field: str) -> tuple[P, str] | None:
    """`params` with the count `field` (steps, samples) halved, and how to say it; None below 2."""
    half = int(getattr(params, field)) // 2
    return (params.model_copy(update={field: half}), f"{field} {half}") if half >= 1 else None


def check(ok: bool, message: str) -> None:
    if not ok:
        raise InvalidField(message)


def same_dtype(model: nn.Module, dtype: torch.dtype) -> Callable[[Tensor], Tensor]:
    """A forward that casts its input back to `dtype` (Captum's float32 noise or baselines would promote it)."""

    def forward(x: Tensor) -> Tensor:
        out: Tensor = model(x if x.dtype == dtype else x.to(dtype))
        return out

    return forward
