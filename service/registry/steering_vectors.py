"""Steering vectors: named tensors that `steering_vector` jobs store and `/interventions` adds by name.

Each is one safetensors file under the jobs directory (`vectors/<name>.safetensors`), its tensor shaped
like one sample's output of the layer it was computed at, with the model, layer and how it was made in
its metadata. A vector belongs to that model and layer: an edit elsewhere is refused, not broadcast.
"""

from __future__ import annotations

import functools
import json
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from service.config import Settings
from service.errors import Conflict, InvalidField, NotFound

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
NAME_RULE = "1-64 letters, digits, '_', '.' or '-', starting with a letter or digit"


@dataclass(frozen=True)
class SteeringVector:
    name: str
    tensor: torch.Tensor  # float32, one sample's output shape at `layer`
    model: str
    layer: str  # the capture key: `name`, or `name#2` for a later call of a reused module
    made: dict[str, Any]  # how: job id, dataset, positive and negative classes and their counts

    def info(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "model": self.model,
            "layer": self.layer,
            "shape": list(self.tensor.shape),
            "norm": float(torch.linalg.vector_norm(self.tensor.double())),
        } | self.made


@functools.lru_cache(maxsize=8)
def vectors_at(root: Path) -> SteeringVectors:
    """One store per directory, so its cache is shared by the jobs that write and the edits that read."""
    return SteeringVectors(root)


def vectors_dir(settings: Settings) -> Path:
    return (settings.jobs_dir or settings.model_dir / ".jobs") / "vectors"


def check_name(name: str) -> str:
    if not NAME.fullmatch(name):
        raise InvalidField(f"steering vector name {name!r}: use {NAME_RULE}")
    return name


class SteeringVectors:
    """The vectors under one directory, read once per file version (a small cache keyed by mtime)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[float, SteeringVector]] = {}

    def _path(self, name: str) -> Path:
        return self.root / f"{check_name(name)}.safetensors"

    def exists(self, name: str) -> bool:
        return self._path(name).is_file()

    def save(self, vector: SteeringVector) -> None:
        """Written to a temporary file and renamed over, so a reader never sees half of it."""
        path = self._path(vector.name)
        self.root.mkdir(parents=True, exist_ok=True)
        meta = {"model": vector.model, "layer": vector.layer, "made": json.dumps(vector.made)}
        data = save_tensors({"vector": vector.tensor.float().contiguous()}, metadata=meta)
        partial = path.with_suffix(".partial")
        partial.write_bytes(data)
        partial.replace(path)

    def get(self, name: str) -> SteeringVector:
        path = self._path(name)
        try:
            mtime = path.stat().st_mtime
        except FileNotFoundError:
            known = ", ".join(self.names()) or "none yet: a steering_vector job makes one"
            raise NotFound(f"no steering vector named {name!r} (stored: {known}; GET /vectors)") from None
        with self._lock:
            cached = self._cache.get(name)
            if cached is not None and cached[0] == mtime:
                return cached[1]
        data = path.read_bytes()
        size = int.from_bytes(data[:8], "little")
        meta = json.loads(data[8 : 8 + size]).get("__metadata__") or {}
        vector = SteeringVector(
            name, load_tensors(data)["vector"], str(meta["model"]), str(meta["layer"]), json.loads(meta["made"])
        )
        with self._lock:
            self._cache[name] = (mtime, vector)
        return vector

    def names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.stem for p in self.root.glob("*.safetensors"))

    def all(self) -> list[SteeringVector]:
        return [self.get(name) for name in self.names()]

    def delete(self, name: str) -> SteeringVector:
        vector = self.get(name)
        self._path(name).unlink(missing_ok=True)
        with self._lock:
            self._cache.pop(name, None)
        return vector

    def reserve(self, name: str) -> None:
        """Refuse a job that would overwrite a stored vector."""
        if self.exists(name):
            raise Conflict(f"a steering vector named {name!r} exists; DELETE /vectors/{name} first or pick another")
