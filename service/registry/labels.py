"""Class labels: one per line in a text file under the model dir."""

from __future__ import annotations

from pathlib import Path

from service.errors import ModelLoadError

MAX_LABELS_BYTES = 16 * 1024 * 1024


def read_labels(path: Path) -> list[str]:
    if path.stat().st_size > MAX_LABELS_BYTES:
        raise ModelLoadError(f"labels file {path.name} is over {MAX_LABELS_BYTES} bytes")
    lines = path.read_text(encoding="utf-8").splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    return [line.strip() for line in lines]
