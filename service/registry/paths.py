"""Server-side paths: every one must resolve inside the model dir (403 otherwise)."""

from __future__ import annotations

from pathlib import Path

from service.errors import Forbidden, NotFound


def resolve_under(root: Path, relative: str, *, must_exist: bool = True) -> Path:
    """Resolve `relative` against `root`, following symlinks; refuse anything that escapes."""
    if not relative or "\x00" in relative:
        raise Forbidden("path must be a non-empty path relative to the model dir")
    candidate = Path(relative)
    if candidate.is_absolute():
        raise Forbidden("absolute paths are refused; give a path relative to the model dir")
    base = root.resolve()
    resolved = (base / candidate).resolve()
    if not resolved.is_relative_to(base):
        raise Forbidden(f"path {relative!r} resolves outside the model dir")
    if must_exist and not resolved.is_file():
        raise NotFound(f"no file {relative!r} under the model dir")
    return resolved
