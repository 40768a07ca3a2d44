"""Bounds on a checkpoint, checked before anything in it is loaded: entries, nesting depth, scan time.

Nothing here unpickles: a torch zip's entry count comes from its end-of-central-directory
record, a safetensors header's from counting its tensors' `data_offsets`, and a pickle's from
walking its opcodes (`pickletools.genops`) with a model of the unpickler's stack that tracks
how deep each value is nested. The scan stops at the first limit it passes, so refusing a
million-entry file costs what reading the first `max_checkpoint_entries` of it costs.
"""

from __future__ import annotations

import pickletools
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

from service.errors import BadInput, TooLarge

ZIP_EXTRA_FILES = 16  # a torch zip's files besides its storages: data.pkl, version, byteorder, ...
STACK_SLACK = 2048  # values a pickle may hold on its stack beyond the entry limit: one batch of 1000 dict items
_CHECK_EVERY = 1024  # opcodes between two looks at the clock

# Opcodes that build a container from the values above the mark (or the top 1-3 values)...
_BUILDS = {"TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "LIST", "DICT", "FROZENSET"}
# ...and opcodes that add the values above the mark to the container below it.
_ADDS = {"APPEND", "APPENDS", "SETITEM", "SETITEMS", "ADDITEMS"}
_PAIRS = {"DICT", "SETITEM", "SETITEMS"}  # their values come as key, value
_CALLS = {"REDUCE", "NEWOBJ", "NEWOBJ_EX", "OBJ", "INST"}  # a call's result is as deep as its arguments
_GETS = {"GET", "BINGET", "LONG_BINGET"}
_PUTS = {"PUT", "BINPUT", "LONG_BINPUT"}


@dataclass(frozen=True)
class CheckpointLimits:
    """`max_checkpoint_entries`, `max_checkpoint_depth` and `max_checkpoint_scan_s` of the settings."""

    entries: int = 100_000
    depth: int = 64
    scan_s: float = 20.0

    def too_many(self, found: str) -> TooLarge:
        return TooLarge(
            f"checkpoint holds {found}, over the limit of {self.entries} entries (max_checkpoint_entries); "
            "refused before loading it"
        )

    def too_deep(self) -> TooLarge:
        return TooLarge(
            f"checkpoint nests values more than {self.depth} levels deep (max_checkpoint_depth); "
            "refused before loading it"
        )

    def too_slow(self) -> TooLarge:
        return TooLarge(
            f"checking the checkpoint took more than {self.scan_s:g} s (max_checkpoint_scan_s); "
            "refused before loading it"
        )


def check_zip_entries(f: IO[bytes], limits: CheckpointLimits) -> None:
    """Refuse a zip whose central directory lists more files than a checkpoint of `limits.entries` storages has.

    Reads only the end-of-central-directory record (and its zip64 twin): O(1), however many
    files the archive lists. An archive without one is left to the zip reader to refuse.
    """
    count = _zip_entry_count(f)
    if count is not None and count > limits.entries + ZIP_EXTRA_FILES:
        raise limits.too_many(f"{count} files (tensor storages)")


def _zip_entry_count(f: IO[bytes]) -> int | None:
    f.seek(0, 2)
    size = f.tell()
    tail_size = min(size, 22 + 65535)  # the record and the longest comment
    f.seek(size - tail_size)
    tail = f.read(tail_size)
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or len(tail) - at < 22:
        return None
    (count,) = struct.unpack_from("<H", tail, at + 10)
    if count != 0xFFFF or at < 20 or tail[at - 20 : at - 16] != b"PK\x06\x07":
        return int(count)
    (record_at,) = struct.unpack_from("<Q", tail, at - 20 + 8)
    f.seek(record_at)
    record = f.read(56)
    if len(record) < 40 or record[:4] != b"PK\x06\x06":
        return None
    (count64,) = struct.unpack_from("<Q", record, 32)
    return int(count64)


def check_safetensors_header(header: bytes, limits: CheckpointLimits) -> None:
    """Refuse a safetensors header (JSON, not yet parsed) describing more tensors than the limit."""
    count = header.count(b'"data_offsets"')  # one per tensor; metadata strings can only add to it
    if count > limits.entries:
        raise limits.too_many(f"{count} tensors")


def check_pickles(f: IO[bytes], limits: CheckpointLimits, pickles: int = 1) -> None:
    """Scan up to `pickles` consecutive pickles of `f` (a legacy torch file holds five) without running them.

    Entries are the items put into dicts, lists and sets (a state dict's tensor is one); the
    values waiting on the unpickler's stack may not outnumber them by more than one batch,
    so a huge tuple is refused as well.
    Raises TooLarge at the first limit passed, BadInput when the opcodes do not parse.
    """
    scan = _Scan(limits)
    try:
        for _ in range(pickles):
            if not f.read(1):
                return
            f.seek(-1, 1)
            scan.run(pickletools.genops(f))
    except TooLarge:
        raise
    except Exception:
        raise BadInput("not a PyTorch checkpoint or safetensors file (or a corrupt/truncated one)") from None


class _Scan:
    """The unpickler's stack with, for each value, how deeply nested it is (a leaf is 0)."""

    def __init__(self, limits: CheckpointLimits) -> None:
        self.limits = limits
        self.deadline = time.monotonic() + limits.scan_s
        self.entries = 0
        self.ops = 0

    def run(self, ops: Iterator[tuple[pickletools.OpcodeInfo, Any, int | None]]) -> None:
        self.entries = 0  # each pickle on its own: a legacy file's sys info and storage keys are not the object's
        stack: list[int] = []
        marks: list[int] = []
        memo: dict[Any, int] = {}
        limits = self.limits
        for op, arg, _ in ops:
            self.ops += 1
            if self.ops % _CHECK_EVERY == 0 and time.monotonic() > self.deadline:
                raise limits.too_slow()
            name = op.name
            if name == "MARK":
                marks.append(len(stack))
                continue
            if name in _PUTS:
                memo[arg] = stack[-1]
                continue
            if name == "MEMOIZE":
                memo[len(memo)] = stack[-1]
                continue
            if name in _GETS:
                stack.append(memo[arg])
                continue
            items, below = self._pop(op, stack, marks)
            depth = self._depth(name, items, below)
            self.entries += _entries(name, items, below)
            if depth > limits.depth:
                raise limits.too_deep()
            stack.extend([depth] * len(op.stack_after))
            if self.entries > limits.entries or len(stack) > limits.entries + STACK_SLACK:
                raise limits.too_many(f"more than {limits.entries} values (dict, list, set or tuple items)")

    @staticmethod
    def _pop(op: pickletools.OpcodeInfo, stack: list[int], marks: list[int]) -> tuple[list[int], list[int]]:
        """(the values above the mark, or the fixed values an opcode takes; the values below the mark it takes)."""
        before = op.stack_before
        if pickletools.markobject in before:
            start = marks.pop()
            items = stack[start:]
            taken = before.index(pickletools.markobject)
            below = stack[start - taken : start] if taken else []
            del stack[start - taken :]
            return items, below
        taken = len(before)
        if taken > len(stack):
            raise ValueError("stack underflow")
        items = stack[len(stack) - taken :] if taken else []
        del stack[len(stack) - taken :]
        return items, []

    @staticmethod
    def _depth(name: str, items: list[int], below: list[int]) -> int:
        if name in _BUILDS:
            return 1 + max(items, default=0)
        if name in _ADDS:
            container = below[0] if below else items[0]
            added = items if below else items[1:]
            return max(container, 1 + max(added, default=0))
        if name in {"PERSID", "BINPERSID"}:
            return 0  # a storage, whatever its key says
        if name in _CALLS:
            return max(0, max(items + below, default=0) - 1)  # the arguments' tuple is not a level
        return max(items + below, default=0)


def _entries(name: str, items: list[int], below: list[int]) -> int:
    """How many entries an opcode adds: the items (key-value pairs) it puts into a container."""
    if name in _ADDS:
        added = len(items) if below else len(items) - 1
    elif name in {"LIST", "DICT", "FROZENSET"}:
        added = len(items)
    else:
        return 0
    return added // 2 if name in _PAIRS else added
