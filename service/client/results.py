"""What the model-running calls return: predictions, activations, gradients, saliency maps.

Tensors are NumPy arrays; `to_torch()` gives the same result with torch tensors (sharing
memory with the arrays, no copy). Field names follow the JSON answers of API.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np

from service.client.tensors import Array

if TYPE_CHECKING:
    import torch

A = TypeVar("A")
B = TypeVar("B")


def _torch(array: Array) -> torch.Tensor:
    import torch

    return torch.from_numpy(array)


@dataclass(frozen=True)
class ClassScore:
    index: int
    label: str
    score: float  # softmax probability


@dataclass(frozen=True)
class Prediction:
    top_k: list[ClassScore]
    logits: list[float] | None = None

    @property
    def top1(self) -> ClassScore:
        return self.top_k[0]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Prediction:
        scores = [ClassScore(int(s["index"]), str(s["label"]), float(s["score"])) for s in data["top_k"]]
        return cls(scores, data.get("logits"))


@dataclass(frozen=True)
class Predictions:
    """`POST /predict`: one `Prediction` per input, in input order."""

    model: str
    predictions: list[Prediction]

    def labels(self) -> list[str]:
        """The top-1 label of every input."""
        return [p.top1.label for p in self.predictions]

    def logits(self) -> Array:
        """Every logit, `[N, K]` (needs `include_logits=True`)."""
        if any(p.logits is None for p in self.predictions):
            raise ValueError("no logits in this answer; call predict(..., include_logits=True)")
        return np.asarray([p.logits for p in self.predictions], dtype=np.float32)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Predictions:
        return cls(str(data["model"]), [Prediction.from_json(p) for p in data["predictions"]])


def _predictions(data: Mapping[str, Any]) -> list[Prediction]:
    return [Prediction.from_json(p) for p in data.get("predictions") or []]


@dataclass(frozen=True)
class Activations(Generic[A]):
    """`POST /activations`: `tensors[layer][side]`, side "output" or "input", each `[N, ...]`."""

    model: str
    tensors: dict[str, dict[str, A]]
    predictions: list[Prediction] = field(default_factory=list)

    def output(self, layer: str) -> A:
        return self._side(layer, "output")

    def input(self, layer: str) -> A:
        return self._side(layer, "input")

    def _side(self, layer: str, side: str) -> A:
        try:
            return self.tensors[layer][side]
        except KeyError:
            raise KeyError(f"no {side} of {layer!r}; captured: {sorted(self.tensors)}") from None

    def flat(self) -> dict[str, A]:
        """Every tensor under its binary key, `"<layer>:<side>"` (as in the safetensors answer)."""
        return {f"{layer}:{side}": t for layer, sides in self.tensors.items() for side, t in sides.items()}

    def map(self, fn: Callable[[A], B]) -> Activations[B]:
        tensors = {layer: {side: fn(t) for side, t in sides.items()} for layer, sides in self.tensors.items()}
        return Activations(self.model, tensors, self.predictions)

    def to_torch(self: Activations[Array]) -> Activations[torch.Tensor]:
        return self.map(_torch)

    @classmethod
    def from_binary(cls, tensors: Mapping[str, Array], rest: Mapping[str, Any]) -> Activations[Array]:
        nested: dict[str, dict[str, Array]] = {}
        for key, array in tensors.items():
            layer, _, side = key.rpartition(":")
            nested.setdefault(layer, {})[side] = array
        order = list(rest.get("activations") or nested)  # the answer's layer order (safetensors sorts keys)
        ordered = {layer: nested[layer] for layer in order if layer in nested}
        return Activations(str(rest["model"]), ordered, _predictions(rest))


@dataclass(frozen=True)
class TensorStats:
    """`format=stats`: a tensor summarised (population std; None when not finite)."""

    shape: list[int]
    dtype: str
    min: float | None
    max: float | None
    mean: float | None
    std: float | None
    zero_fraction: float | None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TensorStats:
        return cls(
            list(data["shape"]),
            str(data["dtype"]),
            *(data.get(k) for k in ("min", "max", "mean", "std", "zero_fraction")),
        )


@dataclass(frozen=True)
class ActivationStats:
    """`POST /activations` with `format=stats`: `stats[layer][side]`."""

    model: str
    stats: dict[str, dict[str, TensorStats]]
    predictions: list[Prediction] = field(default_factory=list)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ActivationStats:
        stats = {
            layer: {side: TensorStats.from_json(s) for side, s in sides.items()}
            for layer, sides in data["activations"].items()
        }
        return cls(str(data["model"]), stats, _predictions(data))


@dataclass(frozen=True)
class Gradients(Generic[A]):
    """`POST /gradients`: d(target logit)/d(layer output) per layer, and d/d(input) under "input"."""

    model: str
    targets: list[int]
    scores: list[float]
    gradients: dict[str, A]

    def map(self, fn: Callable[[A], B]) -> Gradients[B]:
        return Gradients(self.model, self.targets, self.scores, {k: fn(v) for k, v in self.gradients.items()})

    def to_torch(self: Gradients[Array]) -> Gradients[torch.Tensor]:
        return self.map(_torch)


@dataclass(frozen=True)
class TokenInfo:
    """A vision transformer's tokens at the inputs' size: how many, the prefix tokens' names, then the patch grid."""

    count: int
    prefix: list[str]
    grid: tuple[int, int]  # rows, cols of patch tokens, row by row after the prefix
    patch_size: tuple[int, int]

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> TokenInfo | None:
        if data is None:
            return None
        rows, cols = data["grid"]
        height, width = data["patch_size"]
        return cls(int(data["count"]), [str(p) for p in data["prefix"]], (int(rows), int(cols)), (height, width))


@dataclass(frozen=True)
class SaliencyMap(Generic[A]):
    """One input's attribution (the sample's shape; `[h, w]` for gradcam) and heatmap `[H, W]` in [0, 1].

    `tokens`: a map over a vision transformer's patch grid (its prefix tokens left out)."""

    target: int
    label: str
    score: float  # the target's logit
    probability: float
    attribution: A
    heatmap: A
    convergence_delta: float | None = None
    tokens: TokenInfo | None = None


@dataclass(frozen=True)
class Saliency(Generic[A]):
    """`POST /saliency`: one `SaliencyMap` per input."""

    model: str
    method: str
    results: list[SaliencyMap[A]]

    def map(self, fn: Callable[[A], B]) -> Saliency[B]:
        results = [
            SaliencyMap(
                r.target,
                r.label,
                r.score,
                r.probability,
                fn(r.attribution),
                fn(r.heatmap),
                r.convergence_delta,
                r.tokens,
            )
            for r in self.results
        ]
        return Saliency(self.model, self.method, results)

    def to_torch(self: Saliency[Array]) -> Saliency[torch.Tensor]:
        return self.map(_torch)

    @classmethod
    def build(
        cls, data: Mapping[str, Any], arrays: Callable[[int, Mapping[str, Any]], tuple[Array, Array]]
    ) -> Saliency[Array]:
        """`arrays(i, result)` gives input i's (attribution, heatmap), from JSON or from the binary file."""
        results = []
        for i, item in enumerate(data["results"]):
            attribution, heatmap = arrays(i, item)
            results.append(
                SaliencyMap(
                    int(item["target"]),
                    str(item["label"]),
                    float(item["score"]),
                    float(item["probability"]),
                    attribution,
                    heatmap,
                    item.get("convergence_delta"),
                    TokenInfo.from_json(item.get("tokens")),
                )
            )
        return Saliency(str(data["model"]), str(data["method"]), results)


@dataclass(frozen=True)
class Change:
    """How an intervention moved one input's target score."""

    target: int
    label: str
    clean_score: float
    edited_score: float
    delta: float
    kl_divergence: float


@dataclass(frozen=True)
class Intervention(Generic[A]):
    """`POST /interventions`: the top-k before and after the edits, the target's change per input, what fired
    where (`applied`), and captures after the edits (`activations`, as `Activations`; empty unless asked)."""

    model: str
    clean: list[Prediction]
    edited: list[Prediction]
    change: list[Change]
    applied: list[dict[str, Any]]
    activations: Activations[A]

    @classmethod
    def build(cls, data: Mapping[str, Any], activations: Activations[A]) -> Intervention[A]:
        change = [
            Change(
                int(c["target"]),
                str(c["label"]),
                float(c["clean_score"]),
                float(c["edited_score"]),
                float(c["delta"]),
                float(c["kl_divergence"]),
            )
            for c in data["change"]
        ]
        clean = [Prediction.from_json(p) for p in data["clean"]]
        edited = [Prediction.from_json(p) for p in data["edited"]]
        return cls(str(data["model"]), clean, edited, change, list(data["applied"]), activations)


@dataclass(frozen=True)
class ChannelEffect:
    channel: int
    delta: float  # the mean change of the target score when the channel is ablated
    deltas: list[float]  # per input


@dataclass(frozen=True)
class HeadEffect:
    head: int
    delta: float  # the mean change of the target score when the head is ablated
    deltas: list[float]  # per input


@dataclass(frozen=True)
class Sweep:
    """`POST /interventions/sweep`: channels (or, `over="heads"`, an attention module's heads) ranked by the
    change of the target score, most needed first."""

    model: str
    site: str
    call: int
    op: str
    targets: list[int]
    clean_scores: list[float]
    channels: list[ChannelEffect]
    over: str = "channels"
    heads: list[HeadEffect] | None = None  # over="heads": the heads ranked (and `channels` empty)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Sweep:
        effects = [
            ChannelEffect(int(c["channel"]), float(c["delta"]), [float(d) for d in c["deltas"]])
            for c in data["channels"]
        ]
        heads = [
            HeadEffect(int(h["head"]), float(h["delta"]), [float(d) for d in h["deltas"]])
            for h in data.get("heads") or []
        ] or None
        return cls(
            str(data["model"]),
            str(data["site"]),
            int(data["call"]),
            str(data["op"]),
            [int(t) for t in data["targets"]],
            [float(s) for s in data["clean_scores"]],
            effects,
            str(data.get("over", "channels")),
            heads,
        )


@dataclass(frozen=True)
class AttentionMaps(Generic[A]):
    """`POST /attention`: per attention module, the softmax probabilities `[N, heads, queries, T]`.

    `heads` and `queries` say which heads (dim 1) and query rows (dim 2) were answered; `tokens` says
    which token is which (None for a model without a patch grid)."""

    model: str
    tokens: TokenInfo | None
    heads: list[int]
    queries: list[int]
    query_names: list[str]
    maps: dict[str, A]
    predictions: list[Prediction] = field(default_factory=list)

    def __getitem__(self, block: str) -> A:
        try:
            return self.maps[block]
        except KeyError:
            raise KeyError(f"no map of {block!r}; answered: {list(self.maps)}") from None

    def over_patches(self: AttentionMaps[Array], block: str) -> Array:
        """One module's maps over the patch grid, prefix keys left out: `[N, heads, queries, rows, cols]`."""
        if self.tokens is None:
            raise ValueError("this model has no patch grid")
        rows, cols = self.tokens.grid
        found = self[block]
        return found[..., len(self.tokens.prefix) :].reshape(*found.shape[:-1], rows, cols)

    def map(self, fn: Callable[[A], B]) -> AttentionMaps[B]:
        maps = {key: fn(t) for key, t in self.maps.items()}
        return AttentionMaps(
            self.model, self.tokens, self.heads, self.queries, self.query_names, maps, self.predictions
        )

    def to_torch(self: AttentionMaps[Array]) -> AttentionMaps[torch.Tensor]:
        return self.map(_torch)

    @classmethod
    def build(cls, data: Mapping[str, Any], maps: Mapping[str, Array]) -> AttentionMaps[Array]:
        """`data`: the JSON answer (or the binary file's metadata); `maps`: its tensors, in any order."""
        order = list(data.get("attention") or maps)
        return AttentionMaps(
            str(data["model"]),
            TokenInfo.from_json(data.get("tokens")),
            [int(h) for h in data["heads"]],
            [int(q) for q in data["queries"]],
            [str(n) for n in data["query_names"]],
            {key: maps[key] for key in order if key in maps},
            _predictions(data),
        )


@dataclass(frozen=True)
class CostEstimate:
    """A `dry_run` answer: what a request would cost, without running it. `memory_parts` are bytes by part
    (inputs, forward, graph, captures, answer...); `rows_per_forward` the chunk it would run in (None: one
    forward for all); `refusal` the status and reason it would be refused with, when not `admitted`."""

    model: str
    memory_bytes: int
    memory_parts: dict[str, int]
    memory_limit_bytes: int
    forwards: int
    backwards: int
    seconds: float
    deadline_s: float | None
    rows_per_forward: int | None
    admitted: bool
    would_wait: bool
    refusal: str | None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CostEstimate:
        memory = data["memory"]
        deadline = data.get("deadline_s")
        rows = data.get("rows_per_forward")
        return cls(
            str(data["model"]),
            int(memory["bytes"]),
            {str(k): int(v) for k, v in memory["parts"].items()},
            int(memory["limit_bytes"]),
            int(data["forwards"]),
            int(data["backwards"]),
            float(data["seconds"]),
            None if deadline is None else float(deadline),
            None if rows is None else int(rows),
            bool(data["admitted"]),
            bool(data["would_wait"]),
            data.get("refusal"),
        )
