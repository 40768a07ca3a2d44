"""The router with fake groups: routing, answers for the whole cluster, dead replicas, admin refusal, limits."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest
from starlette.testclient import TestClient
from starlette.types import Message

from service.cluster.messages import REPLICA_HEADER, ForwardRequest, ForwardResponse
from service.cluster.router import Group, GroupUnavailable, ReplicaLost, RouterApp, RouterSettings

GROUPS = [Group("digits", ("lenet",)), Group("vision", ("resnet18", "vit"))]
ORDER = ("resnet18", "lenet", "vit")
TOKEN = "t0ken"


class FakeGroups:
    """Each group answers with a JSON echo of what it got; failures scripted per group."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.fail: dict[str, list[BaseException]] = {}
        self.answers: dict[tuple[str, str], Callable[[ForwardRequest], ForwardResponse]] = {}

    async def send(self, group: str, request: ForwardRequest) -> ForwardResponse:
        self.calls.append((group, request.path))
        failures = self.fail.get(group)
        if failures:
            raise failures.pop(0)
        answer = self.answers.get((group, request.path))
        if answer is not None:
            return answer(request)
        body = orjson.dumps({"group": group, "path": request.path, "body": len(request.body)})
        return ForwardResponse(
            200, [(b"content-type", b"application/json"), (REPLICA_HEADER.encode(), f"group-{group}#r1".encode())], body
        )


def make(fake: FakeGroups, groups: list[Group] = GROUPS, **settings: Any) -> TestClient:
    values = {"admin_token": TOKEN, "max_body_bytes": 1000, "max_upload_bytes": 5000, **settings}
    return TestClient(RouterApp(groups, fake.send, RouterSettings(**values), ORDER))


def json_answer(status: int, content: Any, replica: str) -> Callable[[ForwardRequest], ForwardResponse]:
    return lambda _: ForwardResponse(
        status,
        [(b"content-type", b"application/json"), (REPLICA_HEADER.encode(), replica.encode())],
        orjson.dumps(content),
    )


def test_each_request_goes_to_its_models_group() -> None:
    fake = FakeGroups()
    client = make(fake)
    assert client.post("/predict", json={"model": "vit"}).json()["group"] == "vision"
    assert (
        client.post("/predict", data={"model": "lenet"}, files={"image": ("a.png", b"x")}).json()["group"] == "digits"
    )
    assert client.get("/models/resnet18/layers").json()["group"] == "vision"
    assert client.post("/v2/models/lenet/infer", content=b"{}").json()["group"] == "digits"
    assert client.post("/predict", json={"inputs": []}).json()["group"] == "digits"  # no model: any group says why
    assert client.post("/predict", content=b'{"model": "vit"}', headers={"content-type": "text/plain"}).json() == {
        "group": "vision",
        "path": "/predict",
        "body": 16,
    }  # a JSON body whatever its type says, as the app reads it
    # a model no group serves: the first group's app answers as one process would (404, or 422 for the body)
    assert client.post("/predict", json={"model": "nope"}).json()["group"] == "digits"
    assert client.post("/v2/models/nope/infer", content=b"{}").json()["group"] == "digits"


def test_one_group_gets_everything_unparsed() -> None:
    fake = FakeGroups()
    client = make(fake, groups=[Group("models", ())])
    assert client.post("/predict", json={"model": "anything"}).json()["group"] == "models"
    assert client.get("/readyz").json()["path"] == "/readyz"


def test_a_replica_that_dies_is_retried_on_another() -> None:
    fake = FakeGroups()
    fake.fail["digits"] = [ReplicaLost("actor died")]
    response = make(fake).post("/predict", json={"model": "lenet"})
    assert response.status_code == 200
    assert fake.calls == [("digits", "/predict"), ("digits", "/predict")]


def test_when_retries_run_out_it_is_a_503_with_retry_after_never_a_500() -> None:
    fake = FakeGroups()
    fake.fail["digits"] = [ReplicaLost("died"), ReplicaLost("died again")]
    response = make(fake, retry_after_s=3).post("/predict", json={"model": "lenet"})
    assert response.status_code == 503
    assert response.headers["retry-after"] == "3"
    assert "stopped" in response.json()["detail"]
    assert len(fake.calls) == 2
    fake.fail["vision"] = [ReplicaLost("died")]
    assert make(fake, retries=0).get("/models/vit").status_code == 503


def test_a_full_or_empty_group_is_a_503_at_once() -> None:
    fake = FakeGroups()
    fake.fail["vision"] = [GroupUnavailable("queue full")]
    response = make(fake).post("/v2/models/vit/infer", content=b"{}")
    assert response.status_code == 503
    assert "queue full" in response.json()["error"]
    assert response.headers["retry-after"] == "1"
    assert fake.calls == [("vision", "/v2/models/vit/infer")]


def test_models_readiness_and_index_answer_for_every_group() -> None:
    fake = FakeGroups()
    fake.answers[("digits", "/models")] = json_answer(200, {"models": [{"name": "lenet"}]}, "group-digits#a")
    fake.answers[("vision", "/models")] = json_answer(
        200, {"models": [{"name": "vit"}, {"name": "resnet18"}]}, "group-vision#b"
    )
    fake.answers[("digits", "/readyz")] = json_answer(200, {"status": "ready", "models": {}}, "group-digits#a")
    fake.answers[("vision", "/readyz")] = json_answer(
        503, {"status": "not ready", "models": {"vit": {"status": "loading"}}}, "group-vision#b"
    )
    fake.answers[("digits", "/v2/repository/index")] = json_answer(200, [{"name": "lenet"}], "group-digits#a")
    fake.answers[("vision", "/v2/repository/index")] = json_answer(200, [{"name": "vit"}], "group-vision#b")
    client = make(fake)
    models = client.get("/models")
    assert [m["name"] for m in models.json()["models"]] == ["resnet18", "lenet", "vit"]  # the TOML's order
    assert models.headers[REPLICA_HEADER] == "group-digits#a, group-vision#b"
    ready = client.get("/readyz")
    assert ready.status_code == 503
    assert ready.json() == {"status": "not ready", "models": {"vit": {"status": "loading"}}}
    assert [m["name"] for m in client.post("/v2/repository/index", json={}).json()] == ["lenet", "vit"]
    fake.fail["vision"] = [GroupUnavailable("no replica"), GroupUnavailable("no replica")]
    down = client.get("/readyz")
    assert down.status_code == 503
    assert down.json()["models"]["vit"]["status"] == "unavailable"
    assert client.get("/v2/health/ready").json() == {"error": "group 'vision' has no replica"}


def test_the_router_itself_answers_liveness() -> None:
    fake = FakeGroups()
    client = make(fake)
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/v2/health/live").json() == {"live": True}
    assert client.get("/metrics").status_code == 404
    assert fake.calls == []


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/models"), ("DELETE", "/models/lenet"), ("POST", "/v2/repository/models/lenet/load")],
)
def test_admin_calls_check_the_token_then_are_refused_with_409(method: str, path: str) -> None:
    fake = FakeGroups()
    client = make(fake)
    assert client.request(method, path).status_code == 401
    assert client.request(method, path, headers={"Authorization": "Bearer wrong"}).status_code == 401
    refused = client.request(method, path, headers={"Authorization": f"Bearer {TOKEN}"})
    assert refused.status_code == 409
    text = refused.text
    assert "Serve config" in text
    assert "models TOML" in text
    assert make(fake, admin_token=None).request(method, path).status_code == 403
    assert fake.calls == []


def test_bodies_over_the_limit_are_413_before_any_group_sees_them() -> None:
    fake = FakeGroups()
    client = make(fake)
    too_big = client.post("/predict", content=b"x" * 1001, headers={"content-type": "application/json"})
    assert too_big.status_code == 413
    assert too_big.json() == {"detail": "request body over the 1000-byte limit (max_body_bytes)"}
    assert client.post("/v2/models/lenet/infer", content=b"x" * 1001).json()["error"].startswith("request body over")
    upload = client.post("/checkpoints/inspect", files={"file": ("c.pt", b"x" * 3000)})
    assert upload.status_code == 200  # uploads get max_upload_bytes
    assert fake.calls == [("digits", "/checkpoints/inspect")]

    def chunked() -> Iterator[bytes]:
        for _ in range(11):
            yield b"y" * 100

    streamed = client.post("/predict", content=chunked())  # no Content-Length: counted as it streams
    assert streamed.status_code == 413


def test_large_bodies_are_searched_for_their_model_off_the_event_loop() -> None:
    fake = FakeGroups()
    client = make(fake, max_body_bytes=8 * 1024 * 1024)
    body = orjson.dumps({"model": "vit", "inputs": ["x" * (2 * 1024 * 1024)]})
    assert (
        client.post("/predict", content=body, headers={"content-type": "application/json"}).json()["group"] == "vision"
    )


def test_lifespan_is_answered() -> None:
    with make(FakeGroups()) as client:  # runs startup and shutdown: would hang or raise if unanswered
        assert client.get("/healthz").status_code == 200


def test_a_client_gone_before_its_body_arrived_is_not_forwarded() -> None:
    fake = FakeGroups()
    app = RouterApp(GROUPS, fake.send, RouterSettings(admin_token=None, max_body_bytes=100, max_upload_bytes=100))
    messages: list[Message] = [
        {"type": "http.request", "body": b'{"model": "le', "more_body": True},
        {"type": "http.disconnect"},
    ]
    sent: list[Message] = []

    async def receive() -> Message:
        return messages.pop(0)

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/predict", "headers": [(b"content-type", b"application/json")]}
    asyncio.run(app(scope, receive, send))
    assert fake.calls == []
    assert sent == []


def test_a_client_that_leaves_while_its_request_runs_cancels_the_call() -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def send(group: str, request: ForwardRequest) -> ForwardResponse:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        raise AssertionError("not cancelled")

    app = RouterApp(GROUPS, send, RouterSettings(admin_token=None, max_body_bytes=100, max_upload_bytes=100))
    sent: list[Message] = []

    async def scenario() -> None:
        body_sent = False

        async def receive() -> Message:
            nonlocal body_sent
            if not body_sent:
                body_sent = True
                return {"type": "http.request", "body": b'{"model": "lenet"}', "more_body": False}
            await started.wait()
            return {"type": "http.disconnect"}

        async def record(message: Message) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": "/predict", "headers": [], "query_string": b""}
        await asyncio.wait_for(app(scope, receive, record), 10)

    asyncio.run(scenario())
    assert cancelled.is_set()
    assert sent == []  # nobody to answer
