"""Server-side paths: every one must resolve inside the model dir (403 otherwise)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from service.errors import Forbidden, NotFound


def resolve_under(root: Path, relative: str, *, must_exist: bool = True, where: str = "the model dir") -> Path:
    """Resolve `relative` against `root` (`where` names it in errors), following symlinks; refuse anything
    that escapes."""
    if not relative or "\x00" in relative:
        raise Forbidden(f"path must be a non-empty path relative to {where}")
    candidate = Path(relative)
    if candidate.is_absolute():
        raise Forbidden(f"absolute paths are refused; give a path relative to {where}")
    base = root.resolve()
    resolved = (base / candidate).resolve()
    if not resolved.is_relative_to(base):
        raise Forbidden(f"path {relative!r} resolves outside {where}")
    if must_exist and not resolved.is_file():
        raise NotFound(f"no file {relative!r} under {where}")
    return resolved


_PATH_KEY = re.compile(r"(?:^|_)(?:path|file|dir|filename|paths|files|dirs)$", re.IGNORECASE)


def is_path_key(key: str) -> bool:
    """A builder kwarg that names a file or folder: `checkpoint_path`, `file`, `cache_dir`, ..."""
    return _PATH_KEY.search(key) is not None


def confine_kwargs(root: Path, kwargs: Mapping[str, Any], where: str = "kwargs") -> dict[str, Any]:
    """`kwargs` with every path-like value resolved under `root` (nested dicts too); Forbidden (403) outside it.

    The refusal reads only the path's text and the model dir's own links, never the file it
    names: it is the same whether or not that file exists. A missing file inside is the builder's to report.
    """
    confined: dict[str, Any] = {}
    for key, value in kwargs.items():
        at = f"{where}.{key}"
        if isinstance(value, Mapping):
            confined[key] = confine_kwargs(root, value, at)
        elif is_path_key(str(key)):
            confined[key] = _confine_value(root, value, at)
        else:
            confined[key] = value
    return confined


def _confine_value(root: Path, value: Any, where: str) -> Any:
    if isinstance(value, str):
        try:
            return str(resolve_under(root, value, must_exist=False))
        except Forbidden as exc:
            raise Forbidden(f"{where}: {exc.detail}") from None
    if isinstance(value, (list, tuple)):
        return [_confine_value(root, v, f"{where}[{i}]") for i, v in enumerate(value)]
    return value  # a number or a flag names no file (`drop_path` is a rate)
