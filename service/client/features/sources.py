"""Which files a feature extraction covers: every file of the directories and globs given, in a stable order.

Nothing is filtered by extension: a file the server cannot decode is listed in the report,
never silently left out. Hidden files and directories (a leading `.`) are skipped, and so is
the output directory when it lies inside a source.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable, Sequence
from pathlib import Path


def image_key(path: str) -> str:
    """The name a file has in the index, the same however its source was spelled (`digits/`, `./digits`, or
    absolute): relative to the working directory when the file lies under it, else absolute; forward slashes."""
    full = os.path.abspath(path)
    relative = os.path.relpath(full)
    inside = relative != os.pardir and not relative.startswith(os.pardir + os.sep)
    return Path(relative if inside else full).as_posix()


def _walk(root: str, exclude: Path | None) -> Iterable[str]:
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = sorted(
            d for d in dirnames if not d.startswith(".") and (exclude is None or (here / d).resolve() != exclude)
        )
        for name in sorted(filenames):
            if not name.startswith("."):
                yield os.path.join(dirpath, name)


def list_images(sources: Sequence[str | Path], exclude: Path | None = None) -> list[tuple[str, Path]]:
    """(key, path) for every file of `sources` (directories, files or glob patterns), sorted by key.

    Raises FileNotFoundError naming a source that matches nothing.
    """
    excluded = exclude.resolve() if exclude is not None else None
    found: dict[str, Path] = {}
    for source in sources:
        text = str(source)
        if os.path.isdir(text):
            paths = list(_walk(text, excluded))
        elif os.path.isfile(text):
            paths = [text]
        else:
            paths = sorted(p for p in glob.glob(text, recursive=True) if os.path.isfile(p))
            if excluded is not None:
                paths = [p for p in paths if excluded not in Path(p).resolve().parents]
        if not paths:
            raise FileNotFoundError(f"no files in or matching {text!r}")
        for path in paths:
            found.setdefault(image_key(path), Path(path))
    return sorted(found.items())
