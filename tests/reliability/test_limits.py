"""One test per limit of issue 6 (DESIGN.md invariant 5): each bound is a clear 4xx/503, never a crash."""

from __future__ import annotations

import gzip
import io
import resource
import struct
import tracemalloc
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
import torch
from fastapi.testclient import TestClient
from PIL import Image

from service.config import Settings
from service.main import create_app
from tests.conftest import ClientFactory, b64, hooks, sample_png, tensor_input, wait_settled, write_lenet
from tests.helpers.config import toy_entry
from tests.helpers.held import hold_rows, wait_queued
from tests.helpers.metrics import queue_depth, scrape, value
from tests.helpers.models import WIDTH, Gate, new_gate
from tests.helpers.serving import BodyMessages, uvicorn_thread
from tests.helpers.waiting import PATIENCE_S, wait_until

KiB = 1024
LIMITS: dict[str, Any] = {
    "max_body_bytes": 64 * KiB,
    "max_upload_bytes": 256 * KiB,
    "max_inputs": 4,
    "max_layers": 3,
    "max_image_pixels": 10_000,
    "max_json_response_bytes": 20_000,
    "max_binary_response_bytes": 10_000,
    "max_ig_steps": 8,
    "max_smoothgrad_samples": 4,
    "max_queue": 2,
}


@pytest.fixture(scope="module")
def gate() -> Gate:
    """The gated model's gate (it opens once: one test holds the model)."""
    return gate_pair[1]


gate_pair = new_gate()


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """lenet and a `Gated` model, one worker thread each, with small limits."""
    model_dir = tmp_path_factory.mktemp("limits")
    gated = toy_entry("gated", "Gated", kwargs={"gate": gate_pair[0]})
    (model_dir / "models.toml").write_text(write_lenet(model_dir) + gated)
    settings = Settings(
        model_dir=model_dir,
        config=model_dir / "models.toml",
        worker_threads=1,
        cpu_threads=2,
        torch_threads=1,
        decode_threads=2,
        **LIMITS,
    )
    with TestClient(create_app(settings)) as c:
        wait_settled(c)
        assert [m["status"] for m in c.get("/models").json()["models"]] == ["ready", "ready"]
        yield c


def predict(client: TestClient, model: str, x: torch.Tensor) -> httpx2.Response:
    return client.post("/predict", json={"model": model, "inputs": [tensor_input(row) for row in x]})


def digit(label: int = 3) -> dict[str, str]:
    return {"image": b64(sample_png(label))}


def png_declaring(width: int, height: int) -> bytes:
    """A valid 1×1 PNG whose IHDR is patched (CRC fixed) to declare `width`×`height` pixels."""
    buffer = io.BytesIO()
    Image.new("L", (1, 1)).save(buffer, "PNG")
    data = bytearray(buffer.getvalue())
    assert data[12:16] == b"IHDR"
    data[16:24] = struct.pack(">II", width, height)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    return bytes(data)


def detail(response: Any) -> str:
    return str(response.json()["detail"])


# ---- request body ------------------------------------------------------------------------


def test_body_over_limit_by_content_length(client: TestClient) -> None:
    body = b'{"model": "lenet", "inputs": []' + b" " * LIMITS["max_body_bytes"] + b"}"
    r = client.post("/predict", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert "max_body_bytes" in detail(r)


def test_body_over_limit_streamed_without_content_length(client: TestClient) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"model": "lenet", "inputs": ['
        for _ in range(100):
            yield b" " * KiB

    r = client.post("/predict", content=chunks(), headers={"content-type": "application/json"})
    assert "content-length" not in r.request.headers
    assert r.request.headers["transfer-encoding"] == "chunked"
    assert r.status_code == 413
    assert "max_body_bytes" in detail(r)


def test_chunked_body_over_limit_through_uvicorn_counts_every_message(tmp_path: Path) -> None:
    """A real server hands a streamed body to the app in many messages, each under the limit: only the
    running total can tell that the body is over it (the TestClient above sends one message)."""
    limit = 1024 * KiB  # uvicorn delivers at most ~64 KiB + one socket read (256 KiB) per message
    (tmp_path / "models.toml").write_text(toy_entry("echo", "Echo"))
    settings = Settings(model_dir=tmp_path, config=tmp_path / "models.toml", worker_threads=1, max_body_bytes=limit)
    app = BodyMessages(create_app(settings))

    def chunks() -> Iterator[bytes]:
        yield b'{"model": "echo", "inputs": ['
        for _ in range(3 * limit // (64 * KiB)):
            yield b" " * (64 * KiB)
        yield b"]}"

    with uvicorn_thread(app) as url:
        r = httpx.post(f"{url}/predict", content=chunks(), headers={"content-type": "application/json"}, timeout=60)
    assert r.request.headers["transfer-encoding"] == "chunked"
    assert r.status_code == 413, r.text
    assert "max_body_bytes" in detail(r)
    assert len(app.sizes) >= 2, app.sizes
    assert max(app.sizes) < limit, app.sizes  # no single message was over the limit
    assert sum(app.sizes) > limit


def test_v2_body_limits_answer_in_the_protocols_error_shape(client: TestClient) -> None:
    """/v2 errors are `{"error": ...}`; a gzip body is bounded after decompression too (a zip bomb)."""
    url = "/v2/models/lenet/infer"
    r = client.post(url, content=b" " * (LIMITS["max_body_bytes"] + 1), headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert "max_body_bytes" in r.json()["error"]
    bomb = gzip.compress(b" " * (4 * LIMITS["max_body_bytes"]))
    assert len(bomb) < KiB
    r = client.post(url, content=bomb, headers={"content-type": "application/json", "content-encoding": "gzip"})
    assert r.status_code == 413
    assert "decompressed" in r.json()["error"]


def multipart_chunks(field: str, filename: str, payload_kib: int, extra: bytes = b"") -> Iterator[bytes]:
    """A multipart form streamed in 1 KiB pieces: `extra` fields, then one file of `payload_kib` KiB."""
    yield extra
    yield f'--XX\r\nContent-Disposition: form-data; name="{field}"; filename="{filename}"\r\n\r\n'.encode()
    for _ in range(payload_kib):
        yield b"\x00" * KiB
    yield b"\r\n--XX--\r\n"


def test_multipart_body_over_limit_streamed_is_413_not_a_parse_error(client: TestClient) -> None:
    """The form parser must not turn the overflow into a 400 'malformed form' (it used to)."""
    model_field = b'--XX\r\nContent-Disposition: form-data; name="model"\r\n\r\nlenet\r\n'
    r = client.post(
        "/predict",
        content=multipart_chunks("image", "big.png", 100, model_field),
        headers={"content-type": "multipart/form-data; boundary=XX"},
    )
    assert r.status_code == 413
    assert "max_body_bytes" in detail(r)


# ---- checkpoint uploads ------------------------------------------------------------------


@pytest.mark.parametrize("streamed", [False, True], ids=["content-length", "chunked"])
def test_checkpoint_upload_over_limit(client: TestClient, streamed: bool) -> None:
    chunks = multipart_chunks("file", "big.pt", 300)
    content: bytes | Iterator[bytes] = chunks if streamed else b"".join(chunks)
    r = client.post(
        "/checkpoints/inspect", content=content, headers={"content-type": "multipart/form-data; boundary=XX"}
    )
    assert r.status_code == 413
    assert "max_upload_bytes" in detail(r)


def test_checkpoint_json_body_keeps_the_body_limit(client: TestClient) -> None:
    """Only multipart uploads stream to disk; a JSON body to the upload path is read into memory."""
    body = b'{"path": "' + b"a" * (LIMITS["max_body_bytes"] + KiB) + b'"}'
    r = client.post("/checkpoints/inspect", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert "max_body_bytes" in detail(r)


def test_checkpoint_upload_streams_to_disk(make_client: ClientFactory, tmp_path: Path) -> None:
    """A 48 MiB upload is inspected while Python holds at most 12 MiB (tracemalloc peak) at any time."""
    size_mib = 48
    checkpoint = tmp_path / "big.pt"
    torch.save({"model_state_dict": {"w": torch.zeros(size_mib * 1024 * 1024 // 4)}}, checkpoint)
    client = make_client(None)
    boundary = b"hookserveboundary"
    head = b"--" + boundary + b'\r\nContent-Disposition: form-data; name="file"; filename="big.pt"\r\n\r\n'
    tail = b"\r\n--" + boundary + b"--\r\n"
    length = len(head) + checkpoint.stat().st_size + len(tail)
    sent: list[dict[str, Any]] = []

    async def drive() -> None:
        """Call the ASGI app directly, reading the file from disk 1 MiB at a time."""
        pieces = iter([head])
        file = checkpoint.open("rb")

        async def receive() -> dict[str, Any]:
            nonlocal pieces
            piece = next(pieces, None)
            if piece is None:
                piece = file.read(1024 * 1024)
                if not piece:
                    pieces, piece = iter([]), tail
            return {"type": "http.request", "body": piece, "more_body": piece is not tail}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": "/checkpoints/inspect",
            "raw_path": b"/checkpoints/inspect",
            "root_path": "",
            "query_string": b"",
            "headers": [
                (b"host", b"testserver"),
                (b"content-type", b"multipart/form-data; boundary=" + boundary),
                (b"content-length", str(length).encode()),
            ],
            "client": ("127.0.0.1", 1),
            "server": ("testserver", 80),
            "state": {},
        }
        try:
            await client.app(scope, receive, send)  # type: ignore[arg-type]
        finally:
            file.close()

    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        assert client.portal is not None
        client.portal.call(drive)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert sent[0]["status"] == 200, sent
    answer = b"".join(m.get("body", b"") for m in sent[1:])
    assert b'"numel":12582912' in answer
    assert peak < 12 * 1024 * 1024, f"peak {peak / 2**20:.1f} MiB while uploading {size_mib} MiB"


# ---- images ------------------------------------------------------------------------------


@pytest.mark.parametrize("multipart", [False, True], ids=["json", "multipart"])
def test_decompression_bomb_refused_from_its_header(client: TestClient, multipart: bool) -> None:
    bomb = png_declaring(30_000, 30_000)
    assert len(bomb) < 100
    assert Image.open(io.BytesIO(bomb)).size == (30_000, 30_000)  # the header is valid (CRC checked)
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if multipart:
        r = client.post("/predict", data={"model": "lenet"}, files={"image": ("bomb.png", bomb, "image/png")})
    else:
        r = client.post("/predict", json={"model": "lenet", "inputs": [{"image": b64(bomb)}]})
    assert r.status_code == 413
    assert "30000x30000" in detail(r)
    assert "max_image_pixels" in detail(r)
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before
    assert grown_kib < 100 * 1024  # decoding would need 900 MB


def test_image_at_limit_is_served(client: TestClient) -> None:
    r = client.post("/predict", json={"model": "lenet", "inputs": [digit()]})
    assert r.status_code == 200
    too_big = io.BytesIO()
    Image.new("L", (101, 100)).save(too_big, "PNG")
    r = client.post("/predict", json={"model": "lenet", "inputs": [{"image": b64(too_big.getvalue())}]})
    assert r.status_code == 413
    assert "10100" in detail(r)


# ---- items and layers per request --------------------------------------------------------


def test_max_inputs(client: TestClient) -> None:
    ok = client.post("/predict", json={"model": "lenet", "inputs": [digit()] * LIMITS["max_inputs"]})
    assert ok.status_code == 200
    assert len(ok.json()["predictions"]) == LIMITS["max_inputs"]
    r = client.post("/predict", json={"model": "lenet", "inputs": [digit()] * (LIMITS["max_inputs"] + 1)})
    assert r.status_code == 413
    assert "max_inputs" in detail(r)
    files = [("image", (f"{i}.png", sample_png(i), "image/png")) for i in range(LIMITS["max_inputs"] + 1)]
    r = client.post("/predict", data={"model": "lenet"}, files=files)
    assert r.status_code == 413
    assert "max_inputs" in detail(r)


@pytest.mark.parametrize("path", ["/activations", "/gradients"])
def test_max_layers(client: TestClient, path: str) -> None:
    body: dict[str, Any] = {"model": "lenet", "inputs": [digit()]}
    if path == "/gradients":
        body["include_input"] = False  # keeps the answer under max_json_response_bytes
    ok = client.post(path, json=body | {"layers": ["fc1", "fc2", "fc3"]})
    assert ok.status_code == 200
    r = client.post(path, json=body | {"layers": ["conv*", "fc*"]})
    assert r.status_code == 422
    assert "5 layers" in detail(r)
    assert "limit of 3" in detail(r)


def test_a_flood_of_layer_names_is_refused_at_once(make_client: ClientFactory, tmp_path: Path) -> None:
    """100000 patterns (1 MB, under the default body limit) are counted before any is matched."""
    client = make_client(write_lenet(tmp_path))
    body = {"model": "lenet", "inputs": [digit()], "layers": [f"x{i}*" for i in range(100_000)]}
    r = client.post("/activations", json=body)
    assert r.status_code == 422
    assert len(r.content) < 64 * KiB
    assert "100000 names given" in detail(r)


def test_many_unknown_layers_are_listed_in_short(make_client: ClientFactory, tmp_path: Path) -> None:
    client = make_client(write_lenet(tmp_path), max_layers=50)
    r = client.post(
        "/activations", json={"model": "lenet", "inputs": [digit()], "layers": [f"x{i}" for i in range(40)]}
    )
    assert r.status_code == 422
    assert "and 30 more" in detail(r)


# ---- response sizes ----------------------------------------------------------------------


def test_json_response_over_limit_gives_advice(client: TestClient) -> None:
    body = {"model": "lenet", "inputs": [digit()], "layers": ["conv1"]}
    r = client.post("/activations", json=body)
    assert r.status_code == 413
    text = detail(r)
    assert "max_json_response_bytes" in text
    assert all(word in text for word in ("stats", "reduce", "safetensors"))
    for advice in ({"format": "stats"}, {"reduce": "mean"}):
        assert client.post("/activations", json=body | advice).status_code == 200


@pytest.mark.parametrize("fmt", ["safetensors", "npz"])
def test_binary_response_over_limit(client: TestClient, fmt: str) -> None:
    body = {"model": "lenet", "inputs": [digit()], "layers": ["conv1"], "format": fmt}
    r = client.post("/activations", json=body)  # 6×28×28 float32 = 18816 bytes
    assert r.status_code == 413
    assert "max_binary_response_bytes" in detail(r)
    ok = client.post("/activations", json=body | {"reduce": "mean"})
    assert ok.status_code == 200
    assert ok.headers["content-type"] == "application/octet-stream"


# ---- saliency work -----------------------------------------------------------------------


def test_integrated_gradients_steps_limit(client: TestClient) -> None:
    body = {"model": "lenet", "inputs": [digit()], "method": "integrated_gradients", "format": "png"}
    assert client.post("/saliency", json=body | {"steps": LIMITS["max_ig_steps"]}).status_code == 200
    r = client.post("/saliency", json=body | {"steps": LIMITS["max_ig_steps"] + 1})
    assert r.status_code == 422
    assert "max_ig_steps" in detail(r)


def test_smoothgrad_samples_limit(client: TestClient) -> None:
    body = {"model": "lenet", "inputs": [digit()], "method": "smoothgrad", "format": "png"}
    assert client.post("/saliency", json=body | {"samples": LIMITS["max_smoothgrad_samples"]}).status_code == 200
    r = client.post("/saliency", json=body | {"samples": LIMITS["max_smoothgrad_samples"] + 1})
    assert r.status_code == 422
    assert "max_smoothgrad_samples" in detail(r)


# ---- queue and deadline ------------------------------------------------------------------


def test_queue_full_is_503_with_retry_after(client: TestClient, gate: Gate) -> None:
    """One job runs (held at its gate), max_queue=2 wait; the next request is refused while the held job still
    runs, so at once, not once a slot frees; afterwards nothing stays queued."""
    with ThreadPoolExecutor(3) as pool:
        try:
            running = pool.submit(predict, client, "gated", hold_rows())
            assert gate.entered.wait(PATIENCE_S), "the held request never reached the model"
            queued = [
                pool.submit(predict, client, "gated", torch.full((1, WIDTH), i)) for i in range(LIMITS["max_queue"])
            ]
            wait_queued(client, "gated", LIMITS["max_queue"])
            refused = predict(client, "gated", torch.ones(1, WIDTH))
            assert not running.done()  # answered while the held job still ran
        finally:
            gate.opened.set()
        assert refused.status_code == 503
        assert int(refused.headers["Retry-After"]) >= 1
        assert "max_queue" in detail(refused)
        assert running.result().status_code == 200
        assert [f.result().status_code for f in queued] == [200] * LIMITS["max_queue"]
    assert queue_depth(client, "gated") == 0
    assert hooks(client, "gated") == 0


def test_deadline_is_504_saying_what_was_cut_off(make_client: ClientFactory) -> None:
    """A running job's result is dropped, a queued job never runs; the model serves on.

    The running job is held at its gate until both answers are in, so both deadlines pass for sure.
    """
    key, gate = new_gate()
    client = make_client(toy_entry("gated", "Gated", kwargs={"gate": key}), request_timeout_s=0.5, worker_threads=1)
    body = {"model": "gated", "layers": ["body"]}
    with ThreadPoolExecutor(2) as pool:
        try:
            running = pool.submit(client.post, "/activations", json=body | {"inputs": [tensor_input(hold_rows()[0])]})
            assert gate.entered.wait(PATIENCE_S), "the held request never reached the model"
            queued = pool.submit(client.post, "/activations", json=body | {"inputs": [tensor_input(torch.ones(WIDTH))]})
            cut_running, cut_queued = running.result(), queued.result()
        finally:
            gate.opened.set()
    assert cut_running.status_code == 504
    assert "request_timeout_s" in detail(cut_running)
    assert "running" in detail(cut_running)
    assert cut_queued.status_code == 504
    assert "queued (it will not run)" in detail(cut_queued)
    wait_until(lambda: hooks(client, "gated") == 0 and queue_depth(client, "gated") == 0, "the held job to end")
    ok = client.post("/activations", json=body | {"inputs": [tensor_input(torch.ones(WIDTH))]})
    assert ok.status_code == 200
    ran = value(scrape(client), "hookserve_job_compute_seconds_count", model="gated", kind="exclusive")
    assert ran == 2  # the held one (its result dropped) and the last one; the queued one never ran


def test_deadline_applies_to_predictions(make_client: ClientFactory) -> None:
    """The 504 comes at the deadline: while the job it cut off is still held at its gate."""
    key, gate = new_gate()
    client = make_client(toy_entry("gated", "Gated", kwargs={"gate": key}), request_timeout_s=0.3, worker_threads=1)
    try:
        r = predict(client, "gated", hold_rows())
        assert not gate.opened.is_set()
    finally:
        gate.opened.set()
    assert r.status_code == 504
    assert "request_timeout_s" in detail(r)
    assert gate.entered.is_set()
