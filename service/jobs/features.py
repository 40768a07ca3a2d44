"""The `features` job: each sample's reduced activations written as shards in the client's features format.

Rows collect per capture key (`<key>:output`, float32, `[rows, features]`) until a shard holds
`shard_size` of them; it is then encoded (byte for byte as `hookserve features` encodes its shards,
row names in its metadata) and handed to the job to write. `index.json` records every shard with its
rows, size and SHA-256, so a folder holding the job's files is read by `read_features` as it is.
The rows not yet in a shard are part of the checkpoint: a resumed job writes the same shards, with
the same bytes, as one that ran through.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, cast

import torch

from service.client.features.store import FeatureIndex, Shard, digest, encode_shard, shard_name
from service.introspection.similarity import FeatureReduce, sample_features
from service.jobs.datasets import Dataset
from service.jobs.kinds import Reduction, by_key

INDEX = "index.json"


class FeaturesReduction(Reduction):
    def __init__(self, parameters: Mapping[str, Any], dataset: Dataset) -> None:
        self.reduce = cast(FeatureReduce, parameters["reduce"])
        self.shard_size = int(parameters["shard_size"])
        self.dataset = dataset
        self.keys: list[str] = []
        self.widths: dict[str, int] = {}
        self.rows: dict[str, list[torch.Tensor]] = {}
        self.indices: list[int] = []
        self.shards: list[Shard] = []
        self.ready: dict[str, bytes] = {}

    @property
    def started(self) -> bool:
        return bool(self.keys)

    def name(self, index: int) -> str:
        """A row's name: its file in a folder data set, its index in a built-in one."""
        return self.dataset.file(index) or f"{self.dataset.name}/{index}"

    def update(self, captured: Mapping[str, torch.Tensor], indices: torch.Tensor) -> None:
        features = {key: sample_features(t, self.reduce).float() for key, t in captured.items()}
        if not self.keys:
            self.keys = list(captured)
            self.widths = {key: int(t.shape[1]) for key, t in features.items()}
            self.rows = {key: [] for key in self.keys}
        for key in self.keys:
            self.rows[key].append(features[key])
        self.indices += [int(i) for i in indices]
        while len(self.indices) >= self.shard_size:
            self._cut(self.shard_size)

    def finish(self) -> None:
        if self.indices:
            self._cut(len(self.indices))

    def take_files(self) -> dict[str, bytes]:
        ready, self.ready = self.ready, {}
        return ready

    def _cut(self, count: int) -> None:
        tensors: dict[str, Any] = {}
        for key in self.keys:
            joined = self._pending(key)
            tensors[f"{key}:output"] = joined[:count].numpy()
            self.rows[key] = [joined[count:]]
        names = [self.name(i) for i in self.indices[:count]]
        self.indices = self.indices[count:]
        data = encode_shard(names, tensors)
        shard = Shard(shard_name(len(self.shards)), "done", names, {}, count, len(data), digest(data))
        self.shards.append(shard)
        self.ready[str(shard.file)] = data

    def state(self) -> dict[str, torch.Tensor]:
        if not self.keys:
            return {}
        done = json.dumps([s.to_json() for s in self.shards]).encode()
        state = {f"{key}/rows": self._pending(key) for key in self.keys}
        order = {f"{key}/order": torch.tensor([i, self.widths[key]]) for i, key in enumerate(self.keys)}
        return state | order | {"/indices": torch.tensor(self.indices, dtype=torch.int64), "/shards": _bytes(done)}

    def _pending(self, key: str) -> torch.Tensor:
        """The rows of `key` not in a shard yet, `[rows, features]`."""
        return torch.cat([torch.zeros(0, self.widths[key]), *self.rows[key]])

    def restore(self, state: Mapping[str, torch.Tensor]) -> None:
        grouped = by_key(state)
        own = grouped.pop("")
        ordered = sorted(grouped.items(), key=lambda item: int(item[1]["order"][0]))
        self.keys = [key for key, _ in ordered]
        self.widths = {key: int(parts["order"][1]) for key, parts in ordered}
        self.rows = {key: [parts["rows"].clone()] for key, parts in ordered}
        self.indices = [int(i) for i in own["indices"].tolist()]
        self.shards = [Shard.from_json(s) for s in json.loads(own["shards"].numpy().tobytes())]

    def index(self, model: str, layers: list[str], chunk: int) -> FeatureIndex:
        """`index.json` of the finished job, as `hookserve features` writes it."""
        request = {"model": model, "layers": layers, "capture": "output", "reduce": self.reduce}
        found = FeatureIndex({"name": model}, request, self.shard_size, chunk, shards=list(self.shards))
        for key in self.keys:
            found.tensors[f"{key}:output"] = {"shape": [self.widths[key]], "dtype": "float32"}
        return found

    def result(self, dataset: Dataset) -> dict[str, Any]:
        return {
            "reduce": self.reduce,
            "rows": sum(s.rows for s in self.shards),
            "files": [INDEX, *(str(s.file) for s in self.shards)],
            "shards": [{"file": s.file, "rows": s.rows, "bytes": s.bytes, "sha256": s.sha256} for s in self.shards],
        }


def _bytes(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone() if data else torch.zeros(0, dtype=torch.uint8)
