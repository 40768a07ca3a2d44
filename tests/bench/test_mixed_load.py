"""The load generator with several payloads at once: clients round-robin, each payload counted apart."""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bench.loadgen import Client, assign_clients, measure, measure_mix
from bench.payloads import json_payload, multipart_payload


class Counting:
    """A live loopback server that counts the requests each path received (and answers /busy with 503)."""

    def __init__(self) -> None:
        self.hits: Counter[str] = Counter()
        routes = [Route(path, self.answer, methods=["POST"]) for path in ("/a", "/b", "/c", "/busy")]
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        app = Starlette(routes=routes)
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="error", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    async def answer(self, request: Request) -> Response:
        await request.body()
        self.hits[request.url.path] += 1
        if request.url.path == "/busy":
            return JSONResponse({"detail": "queue full"}, status_code=503)
        return JSONResponse({"path": request.url.path})


@pytest.fixture(scope="module")
def counting() -> Iterator[Counting]:
    server = Counting()
    server.thread.start()
    deadline = time.monotonic() + 10
    while not server.server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    yield server
    server.server.should_exit = True
    server.thread.join(10)
    server.sock.close()


def test_clients_are_assigned_round_robin() -> None:
    assert assign_clients(2, 8) == [4, 4]
    assert assign_clients(2, 5) == [3, 2]
    assert assign_clients(3, 7) == [3, 2, 2]
    assert assign_clients(1, 4) == [4]
    with pytest.raises(ValueError, match="cannot cover"):
        assign_clients(3, 2)


@pytest.mark.parametrize("client", ["wire", "httpx"])
def test_each_payload_is_counted_apart(counting: Counting, client: Client) -> None:
    jpeg = bytes(range(256)) * 4
    payloads = [
        json_payload("kind-a", "/a", {"model": "m"}),
        multipart_payload("kind-b", "/b", {"model": "m"}, [("x.jpg", jpeg, "image/jpeg")]),
        json_payload("kind-c", "/c", {"model": "m"}, images=3),
    ]
    counting.hits.clear()
    mix = measure_mix(counting.url, payloads, 5, max_requests=60, max_seconds=30.0, warmup_requests=0, client=client)
    assert [p.name for p in mix.parts] == ["kind-a", "kind-b", "kind-c"]
    assert [p.concurrency for p in mix.parts] == [2, 2, 1]
    assert mix.concurrency == 5
    assert mix.completions == 60  # the budget is shared by all payloads
    assert [p.ok for p in mix.parts] == [counting.hits["/a"], counting.hits["/b"], counting.hits["/c"]]
    assert all(p.ok > 0 and p.sent == p.ok and p.errors == {} for p in mix.parts)
    assert sum(mix.shares()) == pytest.approx(1.0)
    assert mix.shares()[0] == pytest.approx(counting.hits["/a"] / 60)
    assert mix.parts[2].images_per_s == pytest.approx(3 * mix.parts[2].rps)
    assert mix.parts[1].sample == '{"path":"/b"}'
    assert {p.wall_s for p in mix.parts} == {mix.wall_s}  # one window


def test_warm_up_covers_every_payload_and_is_not_counted(counting: Counting) -> None:
    payloads = [json_payload("a", "/a", {}), json_payload("b", "/b", {})]
    counting.hits.clear()
    mix = measure_mix(counting.url, payloads, 2, max_requests=10, max_seconds=30.0, warmup_requests=6)
    assert counting.hits["/a"] + counting.hits["/b"] == 16
    assert min(counting.hits["/a"], counting.hits["/b"]) >= 1  # one client each, both warmed
    assert mix.completions == 10


def test_a_failing_payload_does_not_hide_the_others(counting: Counting) -> None:
    payloads = [json_payload("ok", "/a", {}), json_payload("busy", "/busy", {})]
    mix = measure_mix(counting.url, payloads, 2, max_requests=20, max_seconds=30.0, warmup_requests=0)
    ok, busy = mix.parts
    assert ok.ok == mix.completions > 0
    assert busy.ok == 0
    assert busy.errors == {"HTTP 503": busy.sent}
    assert "queue full" in busy.first_error
    assert mix.shares() == [1.0, 0.0]
    assert mix.to_dict()["parts"][1]["share"] == 0.0


def test_single_payload_measure_is_a_mix_of_one(counting: Counting) -> None:
    counting.hits.clear()
    r = measure(counting.url, json_payload("a", "/a", {}), 3, max_requests=9, max_seconds=30.0, warmup_requests=0)
    assert (r.name, r.concurrency, r.ok, r.sent) == ("a", 3, 9, 9)
    assert counting.hits == Counter({"/a": 9})


def test_a_mix_refuses_non_loopback_payload_urls() -> None:
    with pytest.raises(ValueError, match="refusing"):
        measure_mix("http://10.0.0.1:80", [json_payload("a", "/a", {})], 1, max_requests=1)
