"""What the read-only calls return: model INFO, layers, summaries, state dicts, optimizers, checkpoints.

Each type has the fields API.md names; fields a newer server adds are kept in `extra`
(INFO) or ignored, so an older client keeps working against a newer server.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

T = TypeVar("T")


def _known(cls: type[Any], data: Mapping[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


@dataclass(frozen=True)
class ModelInfo:
    """INFO of one model (`GET /models`, `GET /models/{name}`: the latter adds `repr`)."""

    name: str
    source: str
    architecture: str
    status: str  # loading | ready | failed
    dtype: str
    weights: str
    error: str | None = None
    device: str | None = None
    memory_format: str | None = None
    num_parameters: int | None = None
    trainable_parameters: int | None = None
    input_size: list[int] | None = None
    preprocess: dict[str, Any] | None = None
    num_classes: int | None = None
    labels: bool = False
    optimizer: str | None = None
    hooks: int = 0
    load_seconds: float | None = None
    repr: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ModelInfo:
        known = _known(cls, data)
        return cls(**known, extra={k: v for k, v in data.items() if k not in known})

    def to_json(self) -> dict[str, Any]:
        """The INFO as the server sent it."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        if self.repr is None:
            out.pop("repr")
        return out | self.extra


@dataclass(frozen=True)
class Health:
    """`/healthz` and `/readyz` together: `not_ready` maps model names to their status (and error)."""

    live: bool
    ready: bool
    status: str
    not_ready: dict[str, Any]


@dataclass(frozen=True)
class Node:
    """One FX graph node (`GET /models/{name}/nodes`): a name /activations can capture, its op and output shape."""

    name: str
    op: str
    target: str
    module: str
    module_type: str
    inputs: list[str]
    shape: list[Any] | None
    dtype: str | None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Node:
        return cls(**_known(cls, data))


@dataclass(frozen=True)
class Nodes:
    """A model's graph nodes in execution order; `input_size` is the batch their shapes are for."""

    model: str
    input_size: list[int]
    nodes: list[Node]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Nodes:
        return cls(str(data["model"]), list(data["input_size"]), [Node.from_json(n) for n in data["nodes"]])


@dataclass(frozen=True)
class Layer:
    """One named submodule; the root is `""`; `num_parameters` counts the whole subtree."""

    name: str
    type: str
    depth: int
    num_parameters: int
    children: list[str]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Layer:
        return cls(**_known(cls, data))


@dataclass(frozen=True)
class SummaryRow:
    name: str
    type: str
    depth: int
    depth_index: int | None
    output_shape: list[Any]
    num_parameters: int
    mult_adds: int
    recursive: bool | None = None  # torchinfo's "(recursive)": a module already shown, run again

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SummaryRow:
        return cls(**_known(cls, data))


@dataclass(frozen=True)
class Summary:
    """torchinfo's summary: rows, totals, and its printed table in `text`."""

    rows: list[SummaryRow]
    total_params: int
    trainable_params: int
    non_trainable_params: int
    total_mult_adds: int
    input_size_mb: float
    forward_backward_pass_size_mb: float
    params_size_mb: float
    estimated_total_size_mb: float
    text: str

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Summary:
        known = _known(cls, data)
        known["rows"] = [SummaryRow.from_json(r) for r in data["rows"]]
        return cls(**known)


@dataclass(frozen=True)
class StateDictEntry:
    """One state-dict tensor's metadata; the statistics only with `stats=True`."""

    key: str
    shape: list[int]
    dtype: str
    numel: int
    bytes: int
    kind: str  # parameter | buffer
    requires_grad: bool | None = None
    min: float | None = None
    max: float | None = None
    mean: float | None = None
    std: float | None = None
    norm: float | None = None
    nan_count: int | None = None
    inf_count: int | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StateDictEntry:
        return cls(**_known(cls, data))


@dataclass(frozen=True)
class StateDict:
    entries: list[StateDictEntry]
    num_tensors: int
    total_numel: int
    total_bytes: int

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StateDict:
        entries = [StateDictEntry.from_json(e) for e in data["entries"]]
        return cls(entries, int(data["num_tensors"]), int(data["total_numel"]), int(data["total_bytes"]))


@dataclass(frozen=True)
class OptimizerInfo:
    """An optimizer's state_dict metadata: hyper-parameters per group, state entries per parameter."""

    type: str | None
    param_groups: list[dict[str, Any]]
    state: list[dict[str, Any]]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> OptimizerInfo:
        return cls(data.get("type"), list(data["param_groups"]), list(data["state"]))


@dataclass(frozen=True)
class CheckpointStateDict:
    entries: list[StateDictEntry]
    total_numel: int
    num_tensors: int | None = None
    total_bytes: int | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CheckpointStateDict:
        entries = [StateDictEntry.from_json(e) for e in data["entries"]]
        return cls(entries, int(data["total_numel"]), data.get("num_tensors"), data.get("total_bytes"))


@dataclass(frozen=True)
class CheckpointInfo:
    """`POST /checkpoints/inspect`: state dicts and optimizers by key path, other scalars, a comparison."""

    format: str  # pickle | safetensors
    state_dicts: dict[str, CheckpointStateDict]
    optimizers: dict[str, OptimizerInfo]
    other: dict[str, Any]
    compare: dict[str, Any] | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CheckpointInfo:
        state_dicts = {key: CheckpointStateDict.from_json(sd) for key, sd in data["state_dicts"].items()}
        optimizers = {key: OptimizerInfo.from_json(o) for key, o in data["optimizers"].items()}
        return cls(str(data["format"]), state_dicts, optimizers, dict(data["other"]), data.get("compare"))
