"""A lean HTTP/1.1 keep-alive client for the load generator: prebuilt request bytes, one socket.

The load generator shares the two cores with the server it measures, so every millisecond
of client CPU is a millisecond the server does not get. httpx spends about 1.5 ms of CPU per
request here and ~11 ms to read a 10 MB answer; this client writes a request that was
encoded once and receives a `Content-Length` answer straight into one preallocated buffer
(`asyncio.BufferedProtocol`, reused from answer to answer, so no copies and no page faults
in Python), or a chunked one piece by piece. That is
all a closed-loop benchmark against our own server needs: no TLS, redirects or proxies.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

HEAD_LIMIT = 64 * 1024  # status line and headers
SCRATCH = 256 * 1024


class WireError(Exception):
    """The connection broke or the answer was not HTTP/1.1 as framed here."""


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes | memoryview  # a sized body is a view of the connection's buffer: valid until its next request


def build_request(host: str, port: int, path: str, headers: dict[str, str], body: bytes) -> bytes:
    """The bytes of one POST, encoded once and sent as is by every client."""
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers.items() if k.lower() not in ("host", "content-length")]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def parse_head(head: bytes | bytearray) -> tuple[int, dict[str, str]]:
    """Status code and lower-cased headers of a response head (without the blank line)."""
    lines = bytes(head).decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise WireError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            raise WireError(f"malformed header line {line[:80]!r}")
        headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers


class ChunkedBody:
    """Incremental decoder of a `Transfer-Encoding: chunked` body."""

    def __init__(self) -> None:
        self._pending = bytearray()
        self._parts: list[bytes] = []
        self.done = False

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        self._pending += data
        while not self.done:
            line_end = self._pending.find(b"\r\n")
            if line_end < 0:
                return
            try:
                size = int(bytes(self._pending[:line_end]).split(b";", 1)[0], 16)
            except ValueError:
                raise WireError("malformed chunk size") from None
            if size == 0:
                end = self._pending.find(b"\r\n\r\n", line_end)  # optional trailers, then a blank line
                if end < 0:
                    return
                self.done = True
                return
            start, stop = line_end + 2, line_end + 2 + size
            if len(self._pending) < stop + 2:
                return
            self._parts.append(bytes(self._pending[start:stop]))
            del self._pending[: stop + 2]

    def body(self) -> bytes:
        return b"".join(self._parts)


class _AnswerReader(asyncio.BufferedProtocol):
    """Reads one answer at a time; the body of a sized answer lands in its final buffer directly."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._scratch = memoryview(bytearray(SCRATCH))
        self._waiter: asyncio.Future[Answer] | None = None
        self._head = bytearray()
        self._status = 0
        self._headers: dict[str, str] = {}
        self._buffer = bytearray()
        self._body_view: memoryview | None = None
        self._filled = 0
        self._chunked: ChunkedBody | None = None
        self.closed = False

    def expect(self) -> asyncio.Future[Answer]:
        """Arm for the next answer."""
        self._waiter = asyncio.get_running_loop().create_future()
        self._head.clear()
        self._body_view = None
        self._chunked = None
        self._filled = 0
        return self._waiter

    # ---- asyncio.BufferedProtocol ----
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._body_view is not None:
            return self._body_view[self._filled :]
        return self._scratch

    def buffer_updated(self, nbytes: int) -> None:
        try:
            if self._body_view is not None:
                self._filled += nbytes
                if self._filled == len(self._body_view):
                    self._finish(self._body_view)
                return
            self._feed(self._scratch[:nbytes])
        except WireError as exc:
            self._fail(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(WireError(f"connection closed ({exc})" if exc else "connection closed by the server"))

    def eof_received(self) -> bool:
        return False  # close the transport

    # ---- framing ----
    def _feed(self, data: memoryview) -> None:
        if self._waiter is None or self._waiter.done():
            raise WireError(f"{len(data)} unexpected bytes between answers")
        if self._chunked is not None:
            self._chunked.feed(data)
            if self._chunked.done:
                self._finish(self._chunked.body())
            return
        self._head += data
        end = self._head.find(b"\r\n\r\n")
        if end < 0:
            if len(self._head) > HEAD_LIMIT:
                raise WireError("response head too large")
            return
        self._status, self._headers = parse_head(self._head[:end])
        rest = bytes(self._head[end + 4 :])  # what came with the head: at most one scratch buffer
        if "chunked" in self._headers.get("transfer-encoding", "").lower():
            self._chunked = ChunkedBody()
            self._chunked.feed(rest)
            if self._chunked.done:
                self._finish(self._chunked.body())
            return
        size = int(self._headers.get("content-length", "0"))
        if len(rest) > size:
            raise WireError("more bytes than Content-Length")
        if len(self._buffer) < size:
            self._buffer = bytearray(size)
        body = memoryview(self._buffer)[:size]
        body[: len(rest)] = rest
        self._filled = len(rest)
        if self._filled == size:
            self._finish(body)
        else:
            self._body_view = body

    def _finish(self, body: bytes | memoryview) -> None:
        self._body_view = None
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(Answer(self._status, self._headers, body))

    def _fail(self, exc: WireError) -> None:
        self._body_view = None
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)
        if self.transport is not None:
            self.transport.close()


class Connection:
    """One keep-alive connection; reopened after the server closes it or an error."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._reader: _AnswerReader | None = None

    async def send(self, request: bytes) -> Answer:
        """Write one prebuilt request and read its whole answer."""
        reader = self._reader
        if reader is None or reader.closed or reader.transport is None or reader.transport.is_closing():
            try:
                _, reader = await asyncio.get_running_loop().create_connection(_AnswerReader, self.host, self.port)
            except OSError as exc:
                raise WireError(f"{type(exc).__name__}: {exc}") from exc
            self._reader = reader
        answer = reader.expect()
        assert reader.transport is not None  # set by connection_made
        reader.transport.write(request)
        try:
            result = await answer
        except BaseException:
            await self.close()
            raise
        if result.headers.get("connection", "").lower() == "close":
            await self.close()
        return result

    async def close(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None and reader.transport is not None:
            reader.transport.close()
