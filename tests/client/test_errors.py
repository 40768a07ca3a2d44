"""Errors become exceptions carrying the status and the server's `detail`; 503s are retried within a bound."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path

import httpx
import pytest

from service import client as hs
from service.client import NO_RETRY, Client, Retry
from service.client.errors import error_from_response, parse_retry_after
from service.zoo.lenet import samples_dir
from tests.client.servers import MAX_INPUTS, TOKEN, hooks, queue_depth, serve_lenet, slow_tensor
from tests.reliability.live_server import LiveServer, slow_input

DIGIT = samples_dir() / "digit_7.png"


def wait_until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        time.sleep(0.02)


# ---- live: each status its exception ---------------------------------------------------------


@pytest.fixture(scope="module")
def client(live: LiveServer) -> Iterator[Client]:
    with Client(live.base_url, token=TOKEN) as c:
        yield c


def test_unknown_model_is_not_found(client: Client) -> None:
    with pytest.raises(hs.NotFound) as info:
        client.predict("nope", DIGIT)
    assert info.value.status == 404
    assert "no model named 'nope'" in info.value.detail


def test_unknown_layer_is_invalid_with_the_closest_names(client: Client) -> None:
    with pytest.raises(hs.InvalidRequest) as info:
        client.activations("lenet", DIGIT, ["convv1"])
    assert info.value.status == 422
    assert "'conv1'" in info.value.detail


def test_undecodable_image_is_a_bad_request(client: Client) -> None:
    with pytest.raises(hs.BadRequest) as info:
        client.predict("lenet", b"this is not an image")
    assert info.value.status == 400
    assert "image[0]" in info.value.detail


def test_too_many_inputs_is_too_large(client: Client) -> None:
    with pytest.raises(hs.TooLarge) as info:
        client.predict("lenet", [DIGIT] * (MAX_INPUTS + 1))
    assert info.value.status == 413
    assert "max_inputs" in info.value.detail


def test_admin_calls_need_the_right_token(live: LiveServer) -> None:
    spec = {"name": "x", "source": "python", "architecture": "slow.py:Slow"}
    with Client(live.base_url, token="wrong") as wrong, pytest.raises(hs.Unauthorized) as info:
        wrong.load_model(spec)
    assert info.value.status == 401
    # no token in the environment either (see the fixture below)
    with Client(live.base_url) as anonymous, pytest.raises(hs.Unauthorized):
        anonymous.unload_model("lenet")


def test_a_path_outside_the_model_dir_is_forbidden(client: Client) -> None:
    with pytest.raises(hs.Forbidden) as info:
        client.inspect_checkpoint(path="../outside.pt")
    assert info.value.status == 403


def test_a_failed_model_is_a_conflict(client: Client) -> None:
    client.load_model({"name": "broken", "source": "python", "architecture": "slow.py:Missing"})
    try:
        with pytest.raises(hs.Conflict, match="failed to load"):
            client.wait_for_model("broken", timeout=60)
        with pytest.raises(hs.Conflict) as info:
            client.predict("broken", DIGIT)
        assert info.value.status == 409
        assert "failed" in info.value.detail
    finally:
        client.unload_model("broken")


def test_validation_errors_have_text_detail_and_their_field_list(client: Client) -> None:
    with pytest.raises(hs.InvalidRequest) as info:
        client.predict("lenet", DIGIT, top_k=0)
    assert isinstance(info.value.detail, str)
    assert info.value.detail.startswith("top_k: ")
    assert [e["loc"] for e in info.value.errors] == [["top_k"]]
    assert "top_k" in str(info.value)
    with pytest.raises(hs.NotFound) as missing:
        client.predict("nope", DIGIT)
    assert missing.value.errors == []


def test_a_misspelt_method_or_parameter_gets_the_closest_name(client: Client) -> None:
    with pytest.raises(hs.InvalidRequest) as method:
        client.saliency("lenet", DIGIT, method="gradcm")
    assert method.value.detail.endswith("; did you mean 'gradcam'?")
    with pytest.raises(hs.InvalidRequest) as param:
        client.saliency("lenet", DIGIT, method="occlusion", params={"stride": 4})
    assert param.value.detail == "stride: Extra inputs are not permitted; did you mean 'strides'?"
    with pytest.raises(hs.NotFound) as model:
        client.predict("lenett", DIGIT)
    assert model.value.detail == "no model named 'lenett'; did you mean 'lenet'? GET /models lists them"


def test_no_server_is_a_transport_error() -> None:
    with Client("http://127.0.0.1:9", retry=NO_RETRY) as client, pytest.raises(hs.TransportError) as info:
        client.health()
    assert info.value.status is None
    assert isinstance(info.value, hs.HookserveError)


@pytest.fixture(autouse=True)
def no_token_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HOOKSERVE_ADMIN_TOKEN", raising=False)


# ---- every status, without a server ------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (400, hs.BadRequest),
        (401, hs.Unauthorized),
        (403, hs.Forbidden),
        (404, hs.NotFound),
        (409, hs.Conflict),
        (413, hs.TooLarge),
        (422, hs.InvalidRequest),
        (503, hs.ServiceUnavailable),
        (504, hs.DeadlineExceeded),
        (500, hs.ServerError),
        (418, hs.ServerError),
    ],
)
def test_each_status_maps_to_its_exception(status: int, cls: type[hs.HookserveError]) -> None:
    response = httpx.Response(status, json={"detail": f"because {status}"}, headers={"Retry-After": "2"})
    error = error_from_response(response)
    assert type(error) is cls
    assert (error.status, error.detail) == (status, f"because {status}")
    assert str(error) == f"{status} because {status}"


def test_not_ready_is_an_answer_not_a_retry() -> None:
    sent: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request.url.path)
        return httpx.Response(503, json={"status": "not ready", "models": {"x": {"status": "loading"}}})

    http = httpx.Client(base_url="http://hookserve.test", transport=httpx.MockTransport(handler))
    with http, Client("http://hookserve.test", http=http) as client:
        health = client.health()
    assert (health.live, health.ready, health.not_ready) == (True, False, {"x": {"status": "loading"}})
    assert sent == ["/readyz"]


def test_v2_and_plain_text_errors_keep_their_message() -> None:
    assert error_from_response(httpx.Response(400, json={"error": "bad tensor"})).detail == "bad tensor"
    assert error_from_response(httpx.Response(502, text="Bad Gateway\n")).detail == "Bad Gateway"


def mock_client(statuses: list[int], retry: Retry, headers: dict[str, str] | None = None) -> tuple[Client, list[int]]:
    """A Client whose transport answers `statuses` in turn (then 200); returns it and the statuses sent."""
    sent: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        status = statuses[len(sent)] if len(sent) < len(statuses) else 200
        sent.append(status)
        if status == 503:
            return httpx.Response(503, json={"detail": "queue full"}, headers=headers or {})
        return httpx.Response(200, json={"models": []})

    http = httpx.Client(base_url="http://hookserve.test", transport=httpx.MockTransport(handler))
    return Client("http://hookserve.test", retry=retry, http=http), sent


def test_503_is_retried_then_answered(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr("service.client.sync.time.sleep", slept.append)
    client, sent = mock_client([503, 503], Retry(max_retries=3, backoff=0.5, jitter=0.0), {"Retry-After": "2"})
    assert client.models() == []
    assert sent == [503, 503, 200]
    assert slept == [2.0, 2.0]  # the server's Retry-After, not the backoff


def test_retries_are_bounded_and_the_wait_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr("service.client.sync.time.sleep", slept.append)
    client, sent = mock_client([503] * 10, Retry(max_retries=2, max_delay=1.5), {"Retry-After": "60"})
    with pytest.raises(hs.ServiceUnavailable) as info:
        client.models()
    assert sent == [503, 503, 503]
    assert slept == [1.5, 1.5]
    assert info.value.retry_after == 60.0


def test_without_retry_after_the_backoff_doubles(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr("service.client.sync.time.sleep", slept.append)
    client, _ = mock_client([503] * 3, Retry(max_retries=3, backoff=0.1, jitter=0.0))
    client.models()
    assert slept == pytest.approx([0.1, 0.2, 0.4])


def test_retry_after_as_an_http_date() -> None:
    when = datetime.now(UTC) + timedelta(seconds=30)
    assert 25 < (parse_retry_after(format_datetime(when, usegmt=True)) or 0) <= 30
    assert parse_retry_after("soon") is None
    assert parse_retry_after(None) is None
    with pytest.raises(ValueError, match="max_retries"):
        Retry(max_retries=-1)


def test_the_async_client_retries_too(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    sent: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(503 if len(sent) < 2 else 200)
        if sent[-1] == 503:
            return httpx.Response(503, json={"detail": "queue full"}, headers={"Retry-After": "0"})
        return httpx.Response(200, json={"models": []})

    async def go() -> list[hs.ModelInfo]:
        http = httpx.AsyncClient(base_url="http://hookserve.test", transport=httpx.MockTransport(handler))
        async with http, hs.AsyncClient("http://hookserve.test", http=http) as client:
            return await client.models()

    assert asyncio.run(go()) == []
    assert sent == [503, 503, 200]


# ---- live: a full queue answers 503, and the client waits its turn -------------------------------


@pytest.fixture(scope="module")
def small_queue(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    env = {"HOOKSERVE_MAX_QUEUE": "1", "HOOKSERVE_WORKER_THREADS": "1"}
    with serve_lenet(tmp_path_factory.mktemp("queue-models"), **env) as server:
        yield server


def fill_the_queue(server: LiveServer, delay: float) -> list[threading.Thread]:
    """One slow job running (its hooks are registered) and one waiting behind it: the queue (1) is full."""
    url = server.base_url

    def send(path: str, body: dict[str, object]) -> None:
        httpx.post(f"{url}{path}", json=body, timeout=60)

    running = threading.Thread(
        target=send, args=("/activations", {"model": "slow", "inputs": [slow_input(delay)], "layers": ["body"]})
    )
    running.start()
    wait_until(lambda: hooks(url, "slow") > 0)
    waiting = threading.Thread(target=send, args=("/predict", {"model": "slow", "inputs": [slow_input()]}))
    waiting.start()
    wait_until(lambda: queue_depth(url, "slow") == 1)
    return [running, waiting]


def test_a_full_queue_is_503_with_retry_after(small_queue: LiveServer, tmp_path: Path) -> None:
    threads = fill_the_queue(small_queue, delay=2.0)
    try:
        with Client(small_queue.base_url, retry=NO_RETRY) as client, pytest.raises(hs.ServiceUnavailable) as info:
            client.predict("slow", slow_tensor(0.0))
        assert info.value.status == 503
        assert "queue full" in info.value.detail
        assert info.value.retry_after is not None
    finally:
        for thread in threads:
            thread.join()


def test_a_retrying_client_gets_its_answer_once_the_queue_drains(small_queue: LiveServer) -> None:
    statuses: list[int] = []
    http = httpx.Client(
        base_url=small_queue.base_url,
        timeout=60,
        trust_env=False,
        event_hooks={"response": [lambda r: statuses.append(r.status_code)]},
    )
    threads = fill_the_queue(small_queue, delay=1.0)
    try:
        with http, Client(small_queue.base_url, http=http, retry=Retry(max_retries=100, max_delay=0.05)) as client:
            answer = client.predict("slow", slow_tensor(0.0))
    finally:
        for thread in threads:
            thread.join()
    assert len(answer.predictions) == 1
    assert statuses[0] == 503  # the queue was full when it first asked
    assert statuses[-1] == 200
    assert set(statuses) == {503, 200}
