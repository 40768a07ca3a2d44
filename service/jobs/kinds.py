"""What each kind of job computes from a chunk's captured activations, its checkpoint, its result and the
disk it needs (estimated before the job starts)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import torch

from service.errors import InvalidField
from service.introspection.similarity import (
    CrossCovariance,
    FeatureReduce,
    feature_count,
    linear_cka,
    sample_features,
)
from service.introspection.unit_stats import Exemplars, Score, UnitStats
from service.jobs.datasets import Dataset
from service.specs.vocab import JobKindName

# Bytes a number takes in the JSON result (digits, separators) and in the float64 checkpoint
_JSON_NUMBER = 24
_STORED_NUMBER = 8
_NAME = 256  # a file name, with its JSON quoting


class Reduction:
    """One job's running result, per capture key."""

    def finish(self) -> None:
        """After the last chunk (a kind that writes files as it goes writes its last ones)."""

    def take_files(self) -> dict[str, bytes]:
        """Files to write into the job's folder now (name: bytes), each handed over once."""
        return {}

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
        for key, parts in by_key(state).items():
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
        for key, parts in by_key(state).items():
            self.layers[key] = Exemplars.from_state(self.k, self.score, parts)

    def result(self, dataset: Dataset) -> dict[str, Any]:
        layers: dict[str, Any] = {}
        for key, found in self.layers.items():
            layers[key] = [
                [_sample(dataset, int(i), float(s)) for s, i in zip(scores, indices, strict=True)]
                for scores, indices in zip(found.scores.tolist(), found.indices.tolist(), strict=True)
            ]
        return {"score": self.score, "k": self.k, "classes": dataset.classes, "layers": layers}


class SimilarityReduction(Reduction):
    """Linear CKA between every pair of the job's capture keys, from one cross-covariance of their features
    side by side (keys in the order of the first chunk, kept in the checkpoint)."""

    def __init__(self, parameters: Mapping[str, Any]) -> None:
        self.reduce = cast(FeatureReduce, parameters["reduce"])
        self.keys: list[str] = []
        self.widths: list[int] = []
        self.covariance: CrossCovariance | None = None

    @property
    def started(self) -> bool:
        return self.covariance is not None

    def update(self, captured: Mapping[str, torch.Tensor], indices: torch.Tensor) -> None:
        if self.covariance is None:
            self.keys = list(captured)
        parts = [sample_features(captured[key], self.reduce) for key in self.keys]
        z = torch.cat(parts, dim=1)
        if self.covariance is None:
            self.widths = [int(part.shape[1]) for part in parts]
            self.covariance = CrossCovariance.first(z)
        else:
            self.covariance.update(z)

    def state(self) -> dict[str, torch.Tensor]:
        if self.covariance is None:
            return {}
        order = {
            f"{key}/width": torch.tensor([i, w]) for i, (key, w) in enumerate(zip(self.keys, self.widths, strict=True))
        }
        return order | {f"/{name}": t for name, t in self.covariance.state().items()}

    def restore(self, state: Mapping[str, torch.Tensor]) -> None:
        grouped = by_key(state)
        sums = grouped.pop("")
        order = sorted(grouped.items(), key=lambda item: int(item[1]["width"][0]))
        self.keys = [key for key, _ in order]
        self.widths = [int(parts["width"][1]) for _, parts in order]
        self.covariance = CrossCovariance.from_state(sums)

    def result(self, dataset: Dataset) -> dict[str, Any]:
        assert self.covariance is not None
        return {
            "reduce": self.reduce,
            "layers": self.keys,
            "features": dict(zip(self.keys, self.widths, strict=True)),
            "cka": linear_cka(self.covariance.centred(), self.widths),
        }


class SteeringReduction(Reduction):
    """Sums of one capture key's outputs over the samples of the positive and of the negative class; the vector is
    the difference of their means, shaped like one sample's output."""

    def __init__(self, parameters: Mapping[str, Any], dataset: Dataset) -> None:
        self.name = str(parameters["name"])
        self.classes = (str(parameters["positive"]), str(parameters["negative"]))
        self.wanted = (dataset.classes.index(self.classes[0]), dataset.classes.index(self.classes[1]))
        self.label = dataset.label
        self.key: str | None = None
        self.sums: list[torch.Tensor] = []
        self.counts = torch.zeros(2, dtype=torch.float64)

    @property
    def started(self) -> bool:
        return self.key is not None

    def update(self, captured: Mapping[str, torch.Tensor], indices: torch.Tensor) -> None:
        ((key, t),) = captured.items()
        if self.key is None:
            self.key = key
            self.sums = [torch.zeros(t.shape[1:], dtype=torch.float64) for _ in self.wanted]
        labels = torch.tensor([self.label(int(i)) for i in indices])
        values = t.detach().to("cpu", torch.float64)
        for side, wanted in enumerate(self.wanted):
            rows = labels == wanted
            self.sums[side] += values[rows].sum(dim=0)
            self.counts[side] += int(rows.sum())

    def state(self) -> dict[str, torch.Tensor]:
        if self.key is None:
            return {}
        return {
            f"{self.key}/positive": self.sums[0],
            f"{self.key}/negative": self.sums[1],
            f"{self.key}/counts": self.counts,
        }

    def restore(self, state: Mapping[str, torch.Tensor]) -> None:
        ((key, parts),) = by_key(state).items()
        self.key, self.sums, self.counts = (
            key,
            [parts["positive"].clone(), parts["negative"].clone()],
            parts["counts"].clone(),
        )

    def vector(self) -> torch.Tensor:
        """Mean over the positive class minus mean over the negative one."""
        missing = [name for name, count in zip(self.classes, self.counts.tolist(), strict=True) if count == 0]
        if missing:
            raise InvalidField(f"no sample of class {missing[0]!r} was read: a steering vector needs both classes")
        return (self.sums[0] / self.counts[0] - self.sums[1] / self.counts[1]).float()

    def result(self, dataset: Dataset) -> dict[str, Any]:
        vector = self.vector()
        counts = [int(c) for c in self.counts.tolist()]
        return {
            "name": self.name,
            "layer": self.key,
            "shape": list(vector.shape),
            "norm": float(torch.linalg.vector_norm(vector.double())),
            "positive": {"class": self.classes[0], "count": counts[0]},
            "negative": {"class": self.classes[1], "count": counts[1]},
        }


def _sample(dataset: Dataset, index: int, score: float) -> dict[str, Any]:
    sample: dict[str, Any] = {"index": index, "score": score, "label": dataset.label(index)}
    file = dataset.file(index)
    if file is not None:
        sample["file"] = file
    return sample


def by_key(state: Mapping[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    grouped: dict[str, dict[str, torch.Tensor]] = {}
    for name, t in state.items():
        key, _, part = name.rpartition("/")
        grouped.setdefault(key, {})[part] = t
    return grouped


def reduction(kind: JobKindName, parameters: Mapping[str, Any], dataset: Dataset) -> Reduction:
    if kind is JobKindName.features:
        from service.jobs.features import FeaturesReduction  # it builds on this module's Reduction

        return FeaturesReduction(parameters, dataset)
    if kind is JobKindName.steering_vector:
        return SteeringReduction(parameters, dataset)
    if kind is JobKindName.unit_stats:
        return UnitStatsReduction(parameters)
    if kind is JobKindName.similarity:
        return SimilarityReduction(parameters)
    return ExemplarsReduction(parameters)


def unit_count(kind: JobKindName, parameters: Mapping[str, Any], shape: tuple[int, ...]) -> int:
    """What the kind keeps per sample of a layer's output of `shape` (batch dimension included): its units as
    `units()` counts them, or for similarity its features."""
    if kind is JobKindName.similarity:
        return feature_count(shape, cast(FeatureReduce, parameters["reduce"]))
    if kind is JobKindName.steering_vector:
        return feature_count(shape, "flatten")
    if kind is JobKindName.features:
        return feature_count(shape, cast(FeatureReduce, parameters["reduce"]))
    return feature_count(shape, "mean")


def job_bytes(kind: JobKindName, parameters: Mapping[str, Any], unit_counts: Mapping[str, int], samples: int) -> int:
    """Disk the job's checkpoint and result take at most, from its layers' unit counts (features for similarity,
    whose checkpoint holds their cross-covariance, and the same again in memory while it runs; for features,
    every sample's row, the checkpoint's rows not yet in a shard and each row's name twice)."""
    total = sum(unit_counts.values())
    if kind is JobKindName.features:
        pending = min(samples, int(parameters["shard_size"]))
        return (samples + pending) * total * 4 + samples * 2 * _NAME + 4096 * (len(unit_counts) + 1)
    if kind is JobKindName.steering_vector:  # two float64 sums, and the float32 vector stored
        return total * (2 * _STORED_NUMBER + 4) + 4096
    if kind is JobKindName.similarity:
        return (total * total + 3 * total) * _STORED_NUMBER + len(unit_counts) ** 2 * _JSON_NUMBER + 4096
    if kind is JobKindName.unit_stats:
        per_unit = int(parameters["bins"]) + 8  # histogram (with under/over) and the statistics
        return total * per_unit * (_STORED_NUMBER + _JSON_NUMBER) + 4096 * len(unit_counts)
    per_unit = int(parameters["k"]) * (2 * _STORED_NUMBER + 4 * _JSON_NUMBER + _NAME)
    return total * per_unit + 4096 * len(unit_counts)
