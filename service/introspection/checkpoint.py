"""Inspect a checkpoint file without executing it: state dicts, optimizer states, other values, a diff.

Pickles are read only by torch's weights-only unpickler (`torch.load(weights_only=True)`), so a
file that needs arbitrary code is refused before any of it runs; safetensors is read by header.
"""

from __future__ import annotations

import json
import math
import pickle
import struct
import zipfile
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import IO, Any

import torch
from safetensors import safe_open
from torch import Tensor, nn

from service.dtypes import BY_SAFETENSORS, dtype_name
from service.errors import BadInput, InvalidField, NotFound
from service.introspection.checkpoint_scan import (
    CheckpointLimits,
    check_pickles,
    check_safetensors_header,
    check_zip_entries,
)
from service.introspection.optimizer import optimizer_metadata, param_names_from_state_dict
from service.introspection.state_dict import checkpoint_state_dict_entries

LEGACY_PICKLES = 5  # a legacy (non-zip) torch file: magic number, protocol, sys info, the object, storage keys
REFUSED = "this file needs arbitrary code to unpickle; refused, nothing in it ran"
UNREADABLE = "not a PyTorch checkpoint or safetensors file (or a corrupt/truncated one)"
PREFERRED_KEYS = ("model_state_dict", "state_dict", "model", "")
MAX_SAFETENSORS_HEADER = 100_000_000  # the limit safetensors itself enforces
MAX_DEPTH = 64  # nesting below this is not walked
MAX_LIST = 1000  # a longer list of plain values is reported by its length and first items


class CheckpointFormat(StrEnum):
    pickle = "pickle"
    safetensors = "safetensors"


def inspect_checkpoint(
    path: Path,
    compare_to: nn.Module | None = None,
    stats: bool = False,
    limits: CheckpointLimits | None = None,
) -> dict[str, Any]:
    """The /checkpoints/inspect answer for the file at `path` (API.md); `compare` is None without a model.

    Refuses code-needing pickles and TorchScript archives with InvalidField (422), anything
    else unreadable with BadInput (400), and a file over `limits` with TooLarge (413) before
    loading any of it. `stats` adds `finite_stats` to every state-dict entry.
    """
    limits = limits or CheckpointLimits()
    try:
        with path.open("rb") as f:
            head = f.read(8)
            is_safetensors = _is_safetensors(f, head, limits)
    except FileNotFoundError:
        raise NotFound("checkpoint file not found") from None
    if is_safetensors:
        found, primary = _read_safetensors(path, stats)
    else:
        found, primary = _walk_pickle(_load_pickle(path, head, limits), stats, limits)
    found["compare"] = None if compare_to is None else _compare(primary, compare_to)
    return found


def _is_safetensors(f: IO[bytes], head: bytes, limits: CheckpointLimits) -> bool:
    """8-byte little-endian header length, then that many bytes of a JSON object (its tensors counted first)."""
    if len(head) < 8:
        return False
    (length,) = struct.unpack("<Q", head)
    if not 2 <= length <= MAX_SAFETENSORS_HEADER or f.read(1) != b"{":
        return False
    text = b"{" + f.read(length - 1)
    check_safetensors_header(text, limits)
    try:
        header = json.loads(text)
    except ValueError:
        return False
    return isinstance(header, dict)


def _read_safetensors(path: Path, stats: bool) -> tuple[dict[str, Any], Mapping[str, Tensor]]:
    sd: dict[str, Tensor] = {}
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata()
            for key in f.keys():  # noqa: SIM118 (safe_open is not a Mapping)
                view = f.get_slice(key)
                info = BY_SAFETENSORS.get(view.get_dtype())
                dtype = info.torch if info is not None else None
                if stats or dtype is None:
                    sd[key] = f.get_tensor(key)
                else:  # shape and dtype only: no data read
                    sd[key] = torch.empty(view.get_shape(), dtype=dtype, device="meta")
    except MemoryError:
        raise
    except Exception:
        raise BadInput(f"unreadable safetensors file: {UNREADABLE}") from None
    found = {
        "format": CheckpointFormat.safetensors.value,
        "state_dicts": {"": checkpoint_state_dict_entries(sd, stats)},
        "optimizers": {},
        "other": {} if metadata is None else {"metadata": dict(metadata)},
    }
    return found, sd


def _load_pickle(path: Path, head: bytes, limits: CheckpointLimits) -> Any:
    is_zip = head[:4] == b"PK\x03\x04"
    if is_zip:
        _check_torch_zip(path, limits)
    elif not head:
        raise BadInput(UNREADABLE)
    else:
        with path.open("rb") as f:
            check_pickles(f, limits, LEGACY_PICKLES)  # their opcodes parse, within the limits
    # torch.load reads any path ending in .safetensors as safetensors: hand it a file object then.
    by_path = is_zip and path.suffix != ".safetensors"
    try:
        if by_path:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        with path.open("rb") as f:
            return torch.load(f, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:  # the opcodes parsed (checked above): what it refused is a global
        raise InvalidField(REFUSED) from None
    except MemoryError:
        raise
    except Exception:
        raise BadInput(UNREADABLE) from None


def _check_torch_zip(path: Path, limits: CheckpointLimits) -> None:
    """A torch zip holds data.pkl and no TorchScript code; its file count, then its pickle, within `limits`."""
    try:
        with path.open("rb") as f:
            check_zip_entries(f, limits)  # before the zip reader builds an object per file
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            if any(n == "constants.pkl" or n.endswith("/constants.pkl") for n in names):
                raise InvalidField("this is a TorchScript archive (code, not a checkpoint); refused, nothing in it ran")
            pickle_name = next((n for n in names if n == "data.pkl" or n.endswith("/data.pkl")), None)
            if pickle_name is None:
                raise BadInput(UNREADABLE)
            with archive.open(pickle_name) as f:
                check_pickles(f, limits)
    except (zipfile.BadZipFile, OSError, EOFError):
        raise BadInput(UNREADABLE) from None


def _walk_pickle(obj: Any, stats: bool, limits: CheckpointLimits) -> tuple[dict[str, Any], Mapping[str, Tensor]]:
    found = _Sorter(limits)
    found.walk(obj, "", 0)
    state_dicts, optimizers = found.state_dicts, found.optimizers
    primary_key = _primary_key(state_dicts)
    primary = state_dicts[primary_key] if primary_key is not None else {}
    names = param_names_from_state_dict(next(iter(optimizers.values())), primary) if optimizers else None
    result = {
        "format": CheckpointFormat.pickle.value,
        "state_dicts": {k: checkpoint_state_dict_entries(sd, stats) for k, sd in state_dicts.items()},
        "optimizers": {
            k: optimizer_metadata(None, opt, names if len(optimizers) == 1 else None) for k, opt in optimizers.items()
        },
        "other": found.other,
    }
    return result, primary


class _Sorter:
    """Sorts every value of a loaded object into state dicts, optimizer states and other values."""

    def __init__(self, limits: CheckpointLimits) -> None:
        self.state_dicts: dict[str, Mapping[str, Tensor]] = {}
        self.optimizers: dict[str, Mapping[str, Any]] = {}
        self.other: dict[str, Any] = {}
        self.limits = limits
        self.visited = 0

    def walk(self, obj: Any, path: str, depth: int) -> None:
        # The scan counted each value once; a value the pickle shares (memo) is walked each time it is reached.
        self._count(1)
        if depth > MAX_DEPTH:
            self.other[path] = f"(nested deeper than {MAX_DEPTH} levels)"
        elif isinstance(obj, Mapping):
            if obj and all(isinstance(k, str) and isinstance(v, Tensor) for k, v in obj.items()):
                self._count(len(obj))
                self.state_dicts[path] = obj
            elif "state" in obj and "param_groups" in obj:
                self.optimizers[path] = obj
            elif not obj:
                self.other[path] = {}
            else:
                for key, value in obj.items():
                    self.walk(value, _join(path, str(key)), depth + 1)
        elif isinstance(obj, (list, tuple, set, frozenset)):
            items = list(obj)
            if all(_is_plain(v) for v in items):
                self._count(len(items))
                plain = [_plain(v) for v in items[:MAX_LIST]]
                self.other[path] = plain if len(items) <= MAX_LIST else {"length": len(items), "first": plain[:16]}
            else:
                for index, value in enumerate(items):
                    self.walk(value, _join(path, str(index)), depth + 1)
        else:
            self.other[path] = _plain(obj)

    def _count(self, values: int) -> None:
        self.visited += values
        if self.visited > self.limits.entries:
            raise self.limits.too_many(f"more than {self.limits.entries} values once its shared values are expanded")


def _is_plain(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def _plain(value: Any) -> Any:
    """A JSON-friendly stand-in for a leaf value that is not part of a state dict or optimizer.

    Non-finite floats become the strings "nan", "inf", "-inf" (JSON has no such numbers).
    """
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if _is_plain(value):
        return value
    if isinstance(value, Tensor):
        if value.numel() == 1:
            item = value.item()
            return _plain(item) if _is_plain(item) else str(item)
        return {"shape": list(value.shape), "dtype": dtype_name(value.dtype)}
    if isinstance(value, torch.dtype):
        return dtype_name(value)
    if isinstance(value, bytes):
        return {"bytes": len(value)}
    return str(value)


def _primary_key(state_dicts: Mapping[str, Mapping[str, Tensor]]) -> str | None:
    """The model's state dict: a preferred key, then a preferred last key segment, then the largest."""
    for key in PREFERRED_KEYS:
        if key in state_dicts:
            return key
    for key in state_dicts:
        if key.rsplit(".", 1)[-1] in PREFERRED_KEYS:
            return key
    return max(state_dicts, key=lambda k: sum(t.numel() for t in state_dicts[k].values()), default=None)


def _compare(sd: Mapping[str, Tensor], model: nn.Module) -> dict[str, Any]:
    """What `model.load_state_dict(sd)` would complain about: missing, unexpected, mis-shaped keys."""
    own = {k: v for k, v in model.state_dict(keep_vars=True).items() if isinstance(v, Tensor)}
    return {
        "missing_keys": [k for k in own if k not in sd],
        "unexpected_keys": [k for k in sd if k not in own],
        "shape_mismatches": [
            {"key": k, "checkpoint_shape": list(sd[k].shape), "model_shape": list(own[k].shape)}
            for k in own
            if k in sd and sd[k].shape != own[k].shape
        ],
    }


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key
