"""A lean HTTP/1.1 keep-alive client for the load generator: prebuilt request bytes, one socket.

The load generator shares the two cores with the server it measures, so every millisecond
of client CPU is a millisecond the server does not get. httpx spends about 1.5 ms of CPU per
request here (and ~12 ms to read a 10 MB answer); this client writes a request that was
encoded once and reads the answer with `Content-Length` or chunked framing, which is all a
closed-loop benchmark against our own server needs (no TLS, no redirects, no proxies).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

READ_LIMIT = 1 << 26  # the stream buffer may hold a whole large answer without pausing the socket


class WireError(Exception):
    """The connection broke or the answer was not HTTP/1.1 as framed here."""


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes


def build_request(host: str, port: int, path: str, headers: dict[str, str], body: bytes) -> bytes:
    """The bytes of one POST, encoded once and sent as is by every client."""
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers.items() if k.lower() not in ("host", "content-length")]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
        raise WireError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers


class Connection:
    """One keep-alive connection; reopened after the server closes it or an error."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._reader is None or self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port, limit=READ_LIMIT)
        return self._reader, self._writer

    async def send(self, request: bytes) -> Answer:
        """Write one prebuilt request and read its whole answer."""
        reader, writer = await self._open()
        try:
            writer.write(request)
            await writer.drain()
            status, headers = _parse_head(await reader.readuntil(b"\r\n\r\n"))
            if "chunked" in headers.get("transfer-encoding", "").lower():
                body = await self._read_chunked(reader)
            else:
                body = await reader.readexactly(int(headers.get("content-length", "0")))
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            await self.close()
            raise WireError(f"{type(exc).__name__}: {exc}") from exc
        if headers.get("connection", "").lower() == "close":
            await self.close()
        return Answer(status, body)

    @staticmethod
    async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
        parts: list[bytes] = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
            if size == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers, then the empty line
                    pass
                return b"".join(parts)
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)

    async def close(self) -> None:
        writer, self._reader, self._writer = self._writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
