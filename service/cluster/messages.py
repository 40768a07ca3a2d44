"""An HTTP request and its answer as plain data, passed between the router and a model group's replica."""

from __future__ import annotations

from dataclasses import dataclass, field

Headers = list[tuple[bytes, bytes]]

REPLICA_HEADER = "x-hookserve-replica"  # which replica answered: "<deployment>#<replica id>"


@dataclass(frozen=True)
class ForwardRequest:
    """What the router read from the client: enough to replay the request against the app in a replica."""

    method: str
    path: str
    query_string: bytes = b""
    headers: Headers = field(default_factory=list)
    body: bytes = b""
    client: tuple[str, int] | None = None
    scheme: str = "http"
    http_version: str = "1.1"

    def header(self, name: bytes) -> bytes | None:
        """The first value of a header (`name` lower-case)."""
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None


@dataclass(frozen=True)
class ForwardResponse:
    """The app's whole answer: status, headers (with the replica header added) and body."""

    status: int
    headers: Headers
    body: bytes

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None
