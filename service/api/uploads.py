"""Checkpoint uploads streamed straight into one scratch file, with bounds on how many and how much at once.

A multipart upload is parsed as it arrives (python-multipart's streaming parser) and its `file`
part written once, to a file of its own under the server's scratch directory; nothing is spooled
and copied. `UploadSlots` admits at most `max_concurrent_uploads` at a time and at most
`max_upload_scratch_bytes` on disk across them (503 with `Retry-After` past either: the disk is
busy, not the request wrong; 413 for one upload over that bound alone). Each upload's scratch is
removed on every path out: success, error, a client that leaves, shutdown (`close` removes the
whole directory) and, at the next start, a process killed mid-upload (`start` removes scratch
directories of pids that no longer run).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from service.errors import BadInput, InvalidField, TooLarge, Unavailable

if TYPE_CHECKING:  # python-multipart defines its callback types for type checkers only
    from python_multipart.multipart import MultipartCallbacks

SCRATCH_PREFIX = "hookserve-scratch-"
FIELD_BYTES = 64 * 1024  # a non-file form field (none is read: they are only bounded)
WRITE_BYTES = 1024 * 1024  # file data is written in pieces of about this size, off the event loop
RETRY_AFTER_S = 2


class UploadSlots:
    """Uploads in progress and the scratch bytes they hold; one scratch directory per server process."""

    def __init__(self, max_concurrent: int, max_scratch_bytes: int, parent: Path | None = None) -> None:
        self.max_concurrent = max_concurrent
        self.max_scratch_bytes = max_scratch_bytes
        self.parent = parent
        self.active = 0
        self.scratch_bytes = 0
        self._root: Path | None = None

    def start(self) -> None:
        """Start-up: remove what servers killed mid-upload left behind (their scratch, under a dead pid)."""
        remove_orphans(self._parent())

    @property
    def root(self) -> Path:
        """The process's scratch directory, made on first use."""
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-", dir=self._parent()))
        return self._root

    @asynccontextmanager
    async def slot(self, declared_bytes: int | None) -> AsyncIterator[UploadScratch]:
        """One upload's scratch file; 503 when `max_concurrent` run already or `declared_bytes` (the request's
        Content-Length, held from the start) cannot fit beside the others."""
        if self.active >= self.max_concurrent:
            raise Unavailable(
                f"{self.active} checkpoint uploads are in progress, the most this server takes at once "
                f"(max_concurrent_uploads); retry shortly, or inspect a file under the model dir by its path",
                retry_after=RETRY_AFTER_S,
            )
        scratch = UploadScratch(self, Path())
        self.hold(scratch, declared_bytes or 0)
        self.active += 1
        folder = Path(tempfile.mkdtemp(prefix="upload-", dir=self.root))
        scratch.path = folder / "checkpoint"
        try:
            yield scratch
        finally:
            self.active -= 1
            self.scratch_bytes -= scratch.held
            shutil.rmtree(folder, ignore_errors=True)

    def hold(self, scratch: UploadScratch, size: int) -> None:
        """Count `scratch` as `size` bytes on disk (if more than it holds): 413 when that upload alone passes
        `max_scratch_bytes`, 503 when all uploads together would."""
        more = size - scratch.held
        if more <= 0:
            return
        if size > self.max_scratch_bytes:
            raise TooLarge(
                f"the upload is over the {self.max_scratch_bytes}-byte bound on scratch disk for uploads "
                f"(max_upload_scratch_bytes); inspect the file by its path under the model dir instead"
            )
        if self.scratch_bytes + more > self.max_scratch_bytes:
            raise Unavailable(
                f"uploads in progress hold {self.scratch_bytes} bytes of scratch disk and this one needs {more} "
                f"more, over the {self.max_scratch_bytes}-byte bound (max_upload_scratch_bytes); retry shortly",
                retry_after=RETRY_AFTER_S,
            )
        self.scratch_bytes += more
        scratch.held = size

    def close(self) -> None:
        """Shutdown: remove the scratch directory with whatever an unfinished upload left in it."""
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    def _parent(self) -> Path:
        return self.parent or Path(tempfile.gettempdir())


@dataclass
class UploadScratch:
    """One upload's file on disk and the bytes counted for it."""

    slots: UploadSlots
    path: Path
    written: int = 0
    held: int = 0  # bytes counted in the slots' total: the declared length, or what was written past it
    _out: BinaryIO | None = field(default=None, repr=False)

    async def write(self, data: bytes) -> None:
        self.slots.hold(self, self.written + len(data))
        self.written += len(data)
        if self._out is None:
            self._out = await run_in_threadpool(self.path.open, "wb")
        await run_in_threadpool(self._out.write, data)

    async def close(self) -> None:
        if self._out is None:
            self._out = await run_in_threadpool(self.path.open, "wb")  # an empty upload is an empty file
        await run_in_threadpool(self._out.close)


@asynccontextmanager
async def received_upload(request: Request, slots: UploadSlots) -> AsyncIterator[Path]:
    """Stream a multipart request's single `file` part into a scratch file: its path, removed on leaving."""
    boundary = _boundary(request.headers.get("content-type", ""))
    length = request.headers.get("content-length", "")
    async with slots.slot(int(length) if length.isdigit() else None) as scratch:
        reader = _PartReader()
        parser = MultipartParser(boundary, reader.callbacks())
        try:
            async for chunk in request.stream():
                parser.write(chunk)
                await reader.flush(scratch, final=False)
            parser.finalize()
        except FormParserError as exc:
            raise BadInput(f"malformed multipart form: {exc}") from None
        finally:
            await reader.flush(scratch, final=True)
            await scratch.close()
        if not reader.found_file:
            raise InvalidField("multipart requests need a 'file' field holding the checkpoint")
        yield scratch.path


class _PartReader:
    """python-multipart callbacks: the `file` part's bytes are collected for writing, other fields bounded."""

    def __init__(self) -> None:
        self.pending = bytearray()
        self.found_file = False
        self._in_file = False
        self._field_bytes = 0
        self._header_name = b""
        self._header_value = b""
        self._disposition = b""

    def callbacks(self) -> MultipartCallbacks:
        return {
            "on_part_begin": self._part_begin,
            "on_part_data": self._part_data,
            "on_header_field": self._header_field,
            "on_header_value": self._header_value_part,
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished,
        }

    async def flush(self, scratch: UploadScratch, *, final: bool) -> None:
        if self.pending and (final or len(self.pending) >= WRITE_BYTES):
            data = bytes(self.pending)
            self.pending.clear()
            await scratch.write(data)

    def _part_begin(self) -> None:
        self._in_file = False
        self._field_bytes = 0
        self._disposition = b""

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_name += data[start:end]

    def _header_value_part(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def _header_end(self) -> None:
        if self._header_name.lower() == b"content-disposition":
            self._disposition = self._header_value
        self._header_name = self._header_value = b""

    def _headers_finished(self) -> None:
        _, options = parse_options_header(self._disposition)
        if options.get(b"name") != b"file":
            return
        if self.found_file:
            raise InvalidField("send one checkpoint per request: the form has more than one 'file' field")
        self.found_file = self._in_file = True

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self._in_file:
            self.pending += data[start:end]
            return
        self._field_bytes += end - start
        if self._field_bytes > FIELD_BYTES:
            raise BadInput(f"a form field other than 'file' is over {FIELD_BYTES} bytes")


def _boundary(content_type: str) -> bytes:
    _, params = parse_options_header(content_type)
    boundary = params.get(b"boundary")
    if not boundary:
        raise BadInput("malformed multipart form: the Content-Type header has no boundary")
    return boundary


def remove_orphans(parent: Path) -> None:
    """Remove scratch directories of server processes that no longer run (killed before they could clean up)."""
    for folder in parent.glob(f"{SCRATCH_PREFIX}*-*"):
        pid = folder.name.removeprefix(SCRATCH_PREFIX).split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
