"""bench.wire's framing on its own: chunked bodies fed in any split, heads, request bytes."""

from __future__ import annotations

import pytest

from bench.wire import ChunkedBody, WireError, build_request, parse_head

CHUNKED = b"4\r\nWiki\r\n6;ext=1\r\npedia \r\nE\r\nin \r\n\r\nchunks.\r\n0\r\nX-Trailer: 1\r\n\r\n"


@pytest.mark.parametrize("step", [1, 2, 3, 7, len(CHUNKED)])
def test_chunked_body_in_any_split(step: int) -> None:
    decoder = ChunkedBody()
    for i in range(0, len(CHUNKED), step):
        assert not decoder.done
        decoder.feed(CHUNKED[i : i + step])
    assert decoder.done
    assert decoder.body() == b"Wikipedia in \r\n\r\nchunks."


def test_chunked_body_waits_for_the_final_blank_line() -> None:
    decoder = ChunkedBody()
    decoder.feed(b"3\r\nabc\r\n0\r\n")
    assert not decoder.done
    decoder.feed(b"\r\n")
    assert decoder.done
    assert decoder.body() == b"abc"


def test_bad_chunk_size_and_bad_heads_are_wire_errors() -> None:
    with pytest.raises(WireError):
        ChunkedBody().feed(b"zz\r\n")
    with pytest.raises(WireError):
        parse_head(b"SPDY/3 200 OK")
    with pytest.raises(WireError):
        parse_head(b"HTTP/1.1 200 OK\r\nno colon here")
    assert parse_head(b"HTTP/1.1 503 Busy\r\nRetry-After: 1\r\nX-A:b") == (503, {"retry-after": "1", "x-a": "b"})


def test_request_bytes() -> None:
    raw = build_request("127.0.0.1", 8000, "/predict", {"content-type": "application/json", "Host": "x"}, b"{}")
    assert raw == (
        b"POST /predict HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nContent-Length: 2\r\n"
        b"content-type: application/json\r\n\r\n{}"
    )
