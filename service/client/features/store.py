"""The files of a feature extraction: sharded safetensors plus `index.json`, written so that nothing is lost.

Every file is written to a temporary name and renamed into place (atomic on POSIX), a shard
before the index that records it. An interruption at any moment therefore leaves a valid
index naming only complete shards; a rerun recomputes exactly the shards not marked done.

`index.json` says what the numbers are and where each file's row is:

    {"format": "hookserve-features", "version": 1,
     "model": INFO of the model (GET /models/{name}, without the fields that change while it serves),
     "request": {"model", "layers", "capture", "reduce"}, "shard_size", "batch_size",
     "tensors": {"fc1:input": {"shape": [400], "dtype": "float32"}},   # per row
     "complete": true,
     "shards": [{"file": "features-00000.safetensors", "status": "done", "rows": 358,
                 "bytes": ..., "sha256": ..., "files": [the file of each row, in row order],
                 "failed": {"a.png": "400 ..."}}]}

A pending shard's `files` is its plan (the files it will hold); a done shard's `files` are its
rows. Each shard also carries its row names in its safetensors `__metadata__` (`files`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load as safetensors_load

from service.client.tensors import Array, safetensors_bytes

FORMAT = "hookserve-features"
VERSION = 1
INDEX = "index.json"
REPORT = "report.json"
VOLATILE_INFO = ("hooks", "load_seconds", "status", "error", "capture_plans")  # change while a model serves
IDENTITY = ("name", "source", "architecture", "weights", "dtype", "input_size", "preprocess", "num_parameters")


def shard_name(number: int) -> str:
    return f"features-{number:05d}.safetensors"


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` via a temporary file in the same directory and a rename."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    try:
        fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)  # the rename itself survives a power cut
    finally:
        os.close(fd)


class DirectoryBusy(OSError):
    """Another run holds the output directory."""


class DirectoryLock:
    """An exclusive lock on an output directory for one run (`fcntl.flock` on the directory itself, so nothing is
    left in it): a second run into the same directory stops at once instead of interleaving its shards."""

    def __init__(self, out_dir: Path) -> None:
        self.path = out_dir
        self._fd: int | None = None

    def __enter__(self) -> DirectoryLock:
        import fcntl

        fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DirectoryBusy(
                f"another run is writing {self.path}; wait for it or choose another directory"
            ) from None
        self._fd = fd
        (self.path / ".lock").unlink(missing_ok=True)  # the lock file of earlier versions
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)  # releases the lock
            self._fd = None


def remove_temporaries(out_dir: Path) -> None:
    """Temporary files a killed run left behind (complete files are never temporaries)."""
    for tmp in out_dir.glob(".*.tmp-*"):
        tmp.unlink(missing_ok=True)


def model_identity(info: Mapping[str, Any]) -> dict[str, Any]:
    return {key: info.get(key) for key in IDENTITY}


@dataclass
class Shard:
    """One shard: its planned files until done, then its rows and failures."""

    file: str | None
    status: str = "pending"  # pending | done
    files: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    rows: int = 0
    bytes: int = 0
    sha256: str | None = None

    @property
    def done(self) -> bool:
        return self.status == "done"

    def planned(self) -> list[str]:
        """Every file this shard covers, rows and failures, in plan order (sorted)."""
        return sorted([*self.files, *self.failed]) if self.done else list(self.files)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"file": self.file, "status": self.status}
        if self.done:
            out |= {"rows": self.rows, "bytes": self.bytes, "sha256": self.sha256}
        return out | {"files": self.files, "failed": dict(sorted(self.failed.items()))}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Shard:
        return cls(
            data.get("file"),
            str(data.get("status", "pending")),
            list(data.get("files", [])),
            dict(data.get("failed", {})),
            int(data.get("rows", 0)),
            int(data.get("bytes", 0)),
            data.get("sha256"),
        )


@dataclass
class FeatureIndex:
    """`index.json` in memory; see the module docstring for the format."""

    model: dict[str, Any]
    request: dict[str, Any]
    shard_size: int
    batch_size: int
    tensors: dict[str, dict[str, Any]] = field(default_factory=dict)
    shards: list[Shard] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return all(s.done for s in self.shards)

    def planned_files(self) -> set[str]:
        return {name for shard in self.shards for name in shard.planned()}

    def plan(self, keys: Sequence[str]) -> None:
        """Add shards for the files not planned yet (all of them in a new index), in key order."""
        known = self.planned_files()
        new = [k for k in keys if k not in known]
        for start in range(0, len(new), self.shard_size):
            self.shards.append(Shard(shard_name(len(self.shards)), files=new[start : start + self.shard_size]))

    def failed(self) -> dict[str, str]:
        return dict(sorted((name, why) for s in self.shards if s.done for name, why in s.failed.items()))

    def rows(self) -> int:
        return sum(s.rows for s in self.shards if s.done)

    def locate(self, name: str) -> tuple[int, int] | None:
        """(shard number, row) of a file's features, or None when it has none (yet)."""
        for number, shard in enumerate(self.shards):
            if shard.done and name in shard.files:
                return number, shard.files.index(name)
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "model": self.model,
            "request": self.request,
            "shard_size": self.shard_size,
            "batch_size": self.batch_size,
            "tensors": self.tensors,
            "complete": self.complete,
            "shards": [s.to_json() for s in self.shards],
        }

    def encode(self) -> bytes:
        return (json.dumps(self.to_json(), indent=1, ensure_ascii=False) + "\n").encode()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FeatureIndex:
        if data.get("format") != FORMAT or data.get("version") != VERSION:
            raise ValueError(f"not a {FORMAT} index (version {VERSION})")
        return cls(
            dict(data["model"]),
            dict(data["request"]),
            int(data["shard_size"]),
            int(data["batch_size"]),
            dict(data.get("tensors") or {}),
            [Shard.from_json(s) for s in data["shards"]],
        )

    @classmethod
    def load(cls, out_dir: Path) -> FeatureIndex:
        return cls.from_json(json.loads((out_dir / INDEX).read_text()))

    def report(self) -> dict[str, Any]:
        """`report.json`: how many files, how many extracted, and every file that failed with why."""
        failed = self.failed()
        return {
            "complete": self.complete,
            "files": sum(len(s.planned()) for s in self.shards),
            "extracted": self.rows(),
            "failed": [{"file": name, "reason": why} for name, why in failed.items()],
        }


def encode_shard(rows: Sequence[str], tensors: Mapping[str, Array]) -> bytes:
    """A shard's safetensors bytes: `tensors[key]` is `[len(rows), ...]`; row names in the metadata.

    The same rows and values always give the same bytes, so a resumed run equals an uninterrupted one.
    """
    return safetensors_bytes(tensors, {"format": FORMAT, "files": json.dumps(list(rows), ensure_ascii=False)})


def shard_intact(out_dir: Path, shard: Shard) -> bool:
    """A done shard whose file is there with the recorded size (a shard without rows has no file)."""
    if not shard.done:
        return False
    if shard.file is None or shard.rows == 0:
        return True
    path = out_dir / shard.file
    return path.is_file() and path.stat().st_size == shard.bytes


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_shard(path: Path) -> dict[str, Array]:
    """A shard's tensors, `[rows, ...]` each."""
    return dict(safetensors_load(path.read_bytes()))


def read_features(out_dir: str | Path, key: str | None = None) -> tuple[list[str], Array]:
    """(file of each row, features `[rows, ...]`) of one tensor key over every done shard, in shard order.

    `key` is `"<layer>:<side>"` as in `index.json`'s `tensors`; it may be left out when there is one.
    """
    root = Path(out_dir)
    index = FeatureIndex.load(root)
    if key is None:
        if len(index.tensors) != 1:
            raise ValueError(f"name one of the tensors {sorted(index.tensors)}")
        (key,) = index.tensors
    if key not in index.tensors:
        raise KeyError(f"no tensor {key!r} in this extraction; it has {sorted(index.tensors)}")
    names: list[str] = []
    parts: list[Array] = []
    for shard in index.shards:
        if shard.done and shard.rows and shard.file is not None:
            names += shard.files
            parts.append(read_shard(root / shard.file)[key])
    if not parts:
        spec = index.tensors[key]
        return [], np.zeros((0, *spec["shape"]), dtype=spec["dtype"])
    return names, np.concatenate(parts)
