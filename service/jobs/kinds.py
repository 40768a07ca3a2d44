"""What each kind of job computes from a chunk's captured activations, its checkpoint, its result and the
disk it needs (estimated before the job starts)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import torch

from service.introspection.unit_stats import Exemplars, Score, UnitStats
from service.jobs.datasets import Dataset
from service.specs.vocab import JobKindName

# Bytes a number takes in the JSON result (digits, separators) and in the float64 checkpoint
_JSON_NUMBER = 24
_STORED_NUMBER = 8


class Reduction:
    """One job's running result, per capture key."""

    def update(self, captured: Mapping[str, torch.Tensor], indices: torch.Tensor) -> None:
        raise NotImplementedError

    @property
    def started(self) -> bool:
        """Some chunk was folded in."""
        raise NotImplementedError

    def state(self) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def restore(self, state: Mapping[str, torch.Tensor]) -> None:
        raise NotImplementedError

    def result(self, dataset: Dataset) -> dict[str, Any]:
        raise NotImplementedError


class UnitStatsReduction(Reduction):
    def __init__(self, parameters: Mapping[str, Any]) -> None:
        self.bins = int(parameters["bins"])
        given = parameters.get("range")
        self.range = (float(given[0]), float(given[1])) if given else None
        self.layers: dict[str, UnitStats] = {}

    @property
    def started(self) -> bool:
        return bool(self.layers)

    def update(self, captured: Mapping[str, torch.Tensor], indices: torch.Tensor) -> None:
        for key, t in captured.items():
            if key in self.layers:
                self.layers[key].update(t)
            else:
                self.layers[key] = UnitStats.first(t, self.bins, self.range)

    def state(self) -> dict[str, torch.Tensor]:
        return {f"{key}/{name}": t for key, stats in self.layers.items() for name, t in stats.state().items()}

    def restore(self, state: Mapping[str, torch.Tensor]) -> None:
        for key, parts in _by_key(state).items():
            self.layers[key] = UnitStats.from_state(parts)

    def result(self, dataset: Dataset) -> dict[str, Any]:
        return {"layers": {key: stats.result() for key, stats in self.layers.items()}}


class ExemplarsReduction(Reduction):
    def __init__(self, parameters: Mapping[str, Any]) -> None:
        self.k = int(parameters["k"])
        self.score = cast(Score, parameters["score"])
        self.layers: dict[str, Exemplars] = {}

    @property
    def started(self) -> bool:
        return bool(self.layers)

    def update(self, captured: Mapping[str, torch.Tensor], indices: torch.Tensor) -> None:
        for key, t in captured.items():
            self.layers.setdefault(key, Exemplars.empty(self.k, self.score)).update(t, indices)

    def state(self) -> dict[str, torch.Tensor]:
        return {f"{key}/{name}": t for key, found in self.layers.items() for name, t in found.state().items()}

    def restore(self, state: Mapping[str, torch.Tensor]) -> None:
        for key, parts in _by_key(state).items():
            self.layers[key] = Exemplars.from_state(self.k, self.score, parts)

    def result(self, dataset: Dataset) -> dict[str, Any]:
        layers: dict[str, Any] = {}
        for key, found in self.layers.items():
            layers[key] = [
                [_sample(dataset, int(i), float(s)) for s, i in zip(scores, indices, strict=True)]
                for scores, indices in zip(found.scores.tolist(), found.indices.tolist(), strict=True)
            ]
        return {"score": self.score, "k": self.k, "classes": dataset.classes, "layers": layers}


def _sample(dataset: Dataset, index: int, score: float) -> dict[str, Any]:
    sample: dict[str, Any] = {"index": index, "score": score, "label": dataset.label(index)}
    file = dataset.file(index)
    if file is not None:
        sample["file"] = file
    return sample


def _by_key(state: Mapping[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    grouped: dict[str, dict[str, torch.Tensor]] = {}
    for name, t in state.items():
        key, _, part = name.rpartition("/")
        grouped.setdefault(key, {})[part] = t
    return grouped


def reduction(kind: JobKindName, parameters: Mapping[str, Any]) -> UnitStatsReduction | ExemplarsReduction:
    return UnitStatsReduction(parameters) if kind is JobKindName.unit_stats else ExemplarsReduction(parameters)


def unit_count(shape: tuple[int, ...]) -> int:
    """Units of a layer's output of `shape` (batch dimension included), as `units()` counts them."""
    if len(shape) < 2:
        return 0
    return int(shape[-1] if len(shape) == 3 else shape[1])


def job_bytes(kind: JobKindName, parameters: Mapping[str, Any], unit_counts: Mapping[str, int]) -> int:
    """Disk the job's checkpoint and result take at most, from its layers' unit counts."""
    total = sum(unit_counts.values())
    if kind is JobKindName.unit_stats:
        per_unit = int(parameters["bins"]) + 8  # histogram (with under/over) and the statistics
        return total * per_unit * (_STORED_NUMBER + _JSON_NUMBER) + 4096 * len(unit_counts)
    per_unit = int(parameters["k"]) * (2 * _STORED_NUMBER + 4 * _JSON_NUMBER + 256)  # 256: a file name
    return total * per_unit + 4096 * len(unit_counts)
