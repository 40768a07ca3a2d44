"""The front around the router, without Ray: one request id per answer, nosniff, and the shutdown cut's JSON 503."""

from __future__ import annotations

import asyncio
import threading

import orjson
import pytest
from starlette.testclient import TestClient
from starlette.types import Message

from service.api.shutdown import ShutdownNotice
from service.cluster.front import RequestIdMiddleware, front_app, serve_front
from service.cluster.messages import ForwardRequest, ForwardResponse
from service.cluster.router import Group, RouterApp, RouterSettings

SETTINGS = RouterSettings(admin_token=None, max_body_bytes=1000, max_upload_bytes=1000)


class Replica:
    """Answers with the request id it was given; with its own `X-Request-ID` unless `with_id` is False."""

    def __init__(self, with_id: bool = True) -> None:
        self.with_id = with_id
        self.seen: list[bytes | None] = []
        self.hold: asyncio.Event | None = None
        self.entered = threading.Event()

    async def send(self, group: str, request: ForwardRequest) -> ForwardResponse:
        self.entered.set()
        if self.hold is not None:
            await self.hold.wait()
        rid = request.header(b"x-request-id")
        self.seen.append(rid)
        headers = [(b"content-type", b"application/json")]
        if self.with_id and rid is not None:
            headers.append((b"x-request-id", rid))
        return ForwardResponse(200, headers, orjson.dumps({"id": rid.decode() if rid else None}))


def client(replica: Replica, notice: ShutdownNotice | None = None) -> TestClient:
    router = RouterApp([Group("models", ())], replica.send, SETTINGS)
    return TestClient(front_app(router, notice or ShutdownNotice()))


@pytest.mark.parametrize("with_id", [True, False])
def test_a_valid_client_id_reaches_the_replica_and_comes_back_once(with_id: bool) -> None:
    replica = Replica(with_id)
    answer = client(replica).post("/predict", json={}, headers={"X-Request-ID": "job-42.a"})
    assert replica.seen == [b"job-42.a"]
    assert answer.headers.get_list("x-request-id") == ["job-42.a"]
    assert answer.headers["x-content-type-options"] == "nosniff"


def test_an_invalid_or_missing_id_is_replaced_by_one_the_replica_shares() -> None:
    replica = Replica()
    front = client(replica)
    for headers in ({"X-Request-ID": "no spaces, please"}, {}):
        answer = front.post("/predict", json={}, headers=headers)
        (given,) = answer.headers.get_list("x-request-id")
        assert len(given) == 32
        assert replica.seen[-1] == given.encode()


def test_the_fronts_own_answers_carry_an_id_too() -> None:
    front = client(Replica())
    for answer in (front.get("/healthz"), front.post("/predict", content=b"x" * 1001)):
        assert len(answer.headers.get_list("x-request-id")) == 1
        assert answer.headers["x-content-type-options"] == "nosniff"


def test_behind_serves_proxy_the_id_is_left_to_the_proxy() -> None:
    router = RouterApp([Group("models", ())], Replica().send, SETTINGS)
    answer = TestClient(RequestIdMiddleware(router, answer_header=False)).post("/predict", json={})
    assert answer.headers.get_list("x-request-id") == []


@pytest.mark.parametrize(("path", "envelope"), [("/predict", "detail"), ("/v2/models/m/infer", "error")])
def test_a_request_still_running_when_the_grace_period_ends_gets_the_json_503(path: str, envelope: str) -> None:
    """Driven as uvicorn drives it (a plain task per request), cut as `GracefulServer` cuts at the grace period."""
    replica, notice = Replica(), ShutdownNotice()
    app = front_app(RouterApp([Group("models", ())], replica.send, SETTINGS), notice)
    sent: list[Message] = []

    async def scenario() -> None:
        replica.hold = asyncio.Event()  # never set: the request runs until it is cut
        body = iter([{"type": "http.request", "body": b"{}", "more_body": False}])
        gone = asyncio.Event()

        async def receive() -> Message:
            message = next(body, None)
            if message is None:
                await gone.wait()
                return {"type": "http.disconnect"}
            return message

        async def send(message: Message) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": path, "headers": [], "query_string": b""}
        task = asyncio.ensure_future(app(scope, receive, send))
        while not replica.entered.is_set():
            await asyncio.sleep(0.01)
        assert notice.cut() == 1
        await asyncio.wait_for(task, 10)

    asyncio.run(scenario())
    start, body = sent
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    assert start["status"] == 503
    assert int(headers["retry-after"]) > 0
    assert headers["content-type"] == "application/json"
    assert headers["x-content-type-options"] == "nosniff"
    assert len([k for k, _ in start["headers"] if k.lower() == b"x-request-id"]) == 1
    assert "shutting down" in orjson.loads(body["body"])[envelope]


def test_a_front_whose_startup_fails_says_so() -> None:
    """The gRPC port taken (its start raises): the front does not serve, and the command learns it to exit 1."""

    async def taken() -> None:
        raise OSError("cannot listen for gRPC on 127.0.0.1:1")

    started: list[bool] = []

    async def fine() -> None:
        started.append(True)

    router = RouterApp([Group("models", ())], Replica().send, SETTINGS, on_startup=taken)
    notice = ShutdownNotice()
    assert (
        serve_front(front_app(router, notice), notice, host="127.0.0.1", port=0, grace_s=1, log_level="error") is False
    )
    with TestClient(front_app(RouterApp([Group("models", ())], Replica().send, SETTINGS, on_startup=fine), notice)):
        assert started == [True]
