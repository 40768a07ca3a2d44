"""Jobs on disk: one row per job in an embedded SQLite database, and a folder per job for its
checkpoint and result (`<jobs_dir>/<id>/`). Files are written to a temporary name and renamed, so a
crash leaves the previous checkpoint whole."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from service.specs.vocab import JobState

MAX_LISTED_ERRORS = 100
DATABASE = "jobs.sqlite"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    model TEXT NOT NULL,
    dataset TEXT NOT NULL,
    layers TEXT NOT NULL,
    parameters TEXT NOT NULL,
    state TEXT NOT NULL,
    done INTEGER NOT NULL DEFAULT 0,
    total INTEGER NOT NULL,
    errors TEXT NOT NULL DEFAULT '[]',
    error_count INTEGER NOT NULL DEFAULT 0,
    error TEXT,
    rate REAL,
    resumed_from INTEGER,
    created REAL NOT NULL,
    started REAL,
    finished REAL
)
"""


@dataclass
class JobRow:
    id: str
    kind: str
    model: str
    dataset: str
    layers: list[str]
    parameters: dict[str, Any]
    state: JobState
    total: int
    done: int = 0
    errors: list[dict[str, Any]] = field(default_factory=list)
    error_count: int = 0
    error: str | None = None
    rate: float | None = None
    resumed_from: int | None = None  # samples done at the checkpoint the last (re)start resumed from
    created: float = field(default_factory=time.time)
    started: float | None = None
    finished: float | None = None

    @property
    def finished_state(self) -> bool:
        return self.state in (JobState.succeeded, JobState.failed, JobState.cancelled)


_COLUMNS = tuple(JobRow.__dataclass_fields__)
_JSON = ("layers", "parameters", "errors")


class JobStore:
    """The database and the job folders under `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(root / DATABASE, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(_SCHEMA)
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def add(self, row: JobRow) -> None:
        values = [_to_db(name, getattr(row, name)) for name in _COLUMNS]
        with self._lock:
            self._db.execute(
                f"INSERT INTO jobs ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})", values
            )
        self.folder(row.id).mkdir(parents=True, exist_ok=True)

    def save(self, row: JobRow) -> None:
        """Write every mutable field of `row`."""
        names = ("state", "done", "errors", "error_count", "error", "rate", "resumed_from", "started", "finished")
        values = [_to_db(name, getattr(row, name)) for name in names]
        with self._lock:
            self._db.execute(f"UPDATE jobs SET {', '.join(f'{n} = ?' for n in names)} WHERE id = ?", [*values, row.id])

    def get(self, job_id: str) -> JobRow | None:
        with self._lock:
            found = self._db.execute(f"SELECT {', '.join(_COLUMNS)} FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return _row(found) if found is not None else None

    def all(self) -> list[JobRow]:
        with self._lock:
            found = self._db.execute(f"SELECT {', '.join(_COLUMNS)} FROM jobs ORDER BY created, id").fetchall()
        return [_row(r) for r in found]

    def count(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM jobs").fetchone()[0])

    def delete(self, job_id: str) -> None:
        """Forget a job: its row, then its folder."""
        with self._lock:
            self._db.execute("DELETE FROM jobs WHERE id = ?", (job_id,))
        shutil.rmtree(self.folder(job_id), ignore_errors=True)

    def folder(self, job_id: str) -> Path:
        return self.root / job_id

    def write(self, job_id: str, name: str, data: bytes) -> None:
        """Replace `<job>/<name>` whole (temporary file, fsync, rename)."""
        path = self.folder(job_id) / name
        tmp = path.with_suffix(path.suffix + ".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def read(self, job_id: str, name: str) -> bytes | None:
        path = self.folder(job_id) / name
        return path.read_bytes() if path.is_file() else None

    def size(self, job_id: str) -> int:
        """Bytes of every file in the job's folder."""
        folder = self.folder(job_id)
        return sum(p.stat().st_size for p in folder.iterdir() if p.is_file()) if folder.is_dir() else 0

    def path(self, job_id: str, name: str) -> Path | None:
        """A file of the job's folder, if it is there (`name` is a plain file name, never a path)."""
        if "/" in name or "\\" in name or name.startswith("."):
            return None
        path = self.folder(job_id) / name
        return path if path.is_file() else None

    def remove(self, job_id: str, name: str) -> None:
        (self.folder(job_id) / name).unlink(missing_ok=True)


def _to_db(name: str, value: Any) -> Any:
    if name in _JSON:
        return json.dumps(value)
    if name == "state":
        return str(value)
    return value


def _row(values: tuple[Any, ...]) -> JobRow:
    fields = dict(zip(_COLUMNS, values, strict=True))
    for name in _JSON:
        fields[name] = json.loads(fields[name])
    fields["state"] = JobState(fields["state"])
    return JobRow(**fields)
