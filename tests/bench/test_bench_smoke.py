"""Smoke test of the benchmark: the load generator against a tiny live server, the report on fake numbers."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from bench.loadgen import Client, check_loopback, measure
from bench.machine import CpuMeter, wait_idle
from bench.payloads import json_payload, multipart_payload
from bench.report import batches, comparison_table, cpu_table, evaluate_targets, render_markdown
from bench.report import main as report_main
from bench.server import BATCH_METRIC
from bench.stats import latency_summary, percentile
from bench.wire import Connection, build_request


class Tiny:
    """A live uvicorn server on an ephemeral loopback port that records what it received."""

    def __init__(self) -> None:
        self.bodies: list[int] = []
        self.forms: list[tuple[str, int]] = []
        app = Starlette(
            routes=[
                Route("/ok", self.ok, methods=["POST"]),
                Route("/form", self.form, methods=["POST"]),
                Route("/busy", self.busy, methods=["POST"]),
                Route("/chunked", self.chunked, methods=["POST"]),
                Route("/close", self.close, methods=["POST"]),
                Route("/big", self.big, methods=["POST"]),
            ]
        )
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="error", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    async def ok(self, request: Request) -> Response:
        self.bodies.append(len(await request.body()))
        return JSONResponse({"ok": True})

    async def form(self, request: Request) -> Response:
        async with request.form() as form:
            image = form["image"]
            assert isinstance(image, UploadFile)
            self.forms.append((str(form["model"]), len(await image.read())))
        return JSONResponse({"ok": True})

    async def busy(self, request: Request) -> Response:
        return JSONResponse({"detail": "queue full"}, status_code=503, headers={"Retry-After": "1"})

    async def chunked(self, request: Request) -> Response:
        async def parts() -> AsyncIterator[bytes]:
            for i in range(3):
                yield f"part{i};".encode()

        return StreamingResponse(parts())  # no Content-Length: Transfer-Encoding chunked

    async def close(self, request: Request) -> Response:
        return Response(b"bye", headers={"Connection": "close"})

    async def big(self, request: Request) -> Response:
        return Response(BIG)


BIG = bytes(range(256)) * (5 * 4096)  # 5 MiB


@pytest.fixture(scope="module")
def tiny() -> Iterator[Tiny]:
    server = Tiny()
    server.thread.start()
    deadline = time.monotonic() + 10
    while not server.server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    yield server
    server.server.should_exit = True
    server.thread.join(10)
    server.sock.close()


@pytest.mark.parametrize("client", ["wire", "httpx"])
def test_loadgen_closed_loop_against_live_server(tiny: Tiny, client: Client) -> None:
    payload = json_payload("ok", "/ok", {"model": "m", "inputs": [1, 2]}, images=2)
    tiny.bodies.clear()
    r = measure(
        tiny.url,
        payload,
        4,
        max_requests=100_000,
        max_seconds=1.0,
        warmup_requests=8,
        server_pid=os.getpid(),
        client=client,
    )
    # A count in a 1 s window and the window's length stay timed: bounds loose enough for a busy machine.
    assert r.ok >= 4  # every client got an answer (hundreds is usual)
    assert r.errors == {}
    assert r.sent == r.ok
    assert 0.9 < r.wall_s < 30.0  # stops at max_seconds, then waits for the requests in flight
    assert r.images_per_s == pytest.approx(2 * r.rps)
    assert r.lat_ms["p50"] <= r.lat_ms["p95"] <= r.lat_ms["p99"] <= r.lat_ms["max"]
    assert r.loadgen_cores > 0.0
    assert r.loadgen_cpu_ms_per_req > 0.0
    assert r.sample == '{"ok":true}'
    assert len(tiny.bodies) == r.ok + 8  # warm-up included
    assert set(tiny.bodies) == {len(payload.content)}


def test_loadgen_bounded_by_count_and_multipart_arrives_as_a_form(tiny: Tiny) -> None:
    jpeg = bytes(range(256)) * 10
    payload = multipart_payload("form", "/form", {"model": "resnet18"}, [("x.jpg", jpeg, "image/jpeg")])
    assert payload.headers["content-type"].startswith("multipart/form-data; boundary=")
    tiny.forms.clear()
    r = measure(tiny.url, payload, 2, max_requests=7, max_seconds=30.0, warmup_requests=0)
    assert (r.sent, r.ok) == (7, 7)
    assert tiny.forms == [("resnet18", len(jpeg))] * 7


@pytest.mark.parametrize(("path", "body"), [("/chunked", b"part0;part1;part2;"), ("/close", b"bye"), ("/big", BIG)])
def test_wire_client_reads_chunked_closing_and_large_answers(tiny: Tiny, path: str, body: bytes) -> None:
    async def go() -> list[tuple[int, bytes]]:
        parts = urlsplit(tiny.url)
        host, port = parts.hostname or "", parts.port or 0
        conn = Connection(host, port)
        request = build_request(host, port, path, {"content-type": "application/json"}, b"{}")
        answers = []
        try:
            for _ in range(3):  # keep-alive, or reopened after a close
                answer = await conn.send(request)
                answers.append((answer.status, bytes(answer.body)))  # the body is valid until the next request
        finally:
            await conn.close()
        return answers

    assert asyncio.run(go()) == [(200, body)] * 3
    r = measure(tiny.url, json_payload("p", path, {}), 2, max_requests=10, max_seconds=10.0, warmup_requests=0)
    assert (r.ok, r.errors, r.response_bytes) == (10, {}, len(body))


def test_loadgen_counts_http_errors(tiny: Tiny) -> None:
    r = measure(tiny.url, json_payload("busy", "/busy", {}), 1, max_requests=5, max_seconds=10.0, warmup_requests=0)
    assert r.ok == 0
    assert r.errors == {"HTTP 503": 5}
    assert "queue full" in r.first_error


@pytest.mark.parametrize(
    "url", ["http://10.1.2.3:80/predict", "http://example.com/predict", "ftp://127.0.0.1/x", "http:///nohost"]
)
def test_loadgen_refuses_non_loopback(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_dns(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a refused host must not be resolved")

    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    with pytest.raises(ValueError, match="refusing"):
        check_loopback(url)


def test_loopback_urls_pass() -> None:
    for url in ("http://127.0.0.1:8000/predict", "http://127.5.6.7/", "http://[::1]:8000/x"):
        check_loopback(url)


def test_percentiles_match_numpy() -> None:
    values = [5.0, 1.0, 9.0, 3.0, 7.0, 2.0]
    summary = latency_summary(values)
    for p in (50, 95, 99):
        assert summary[f"p{p}"] == pytest.approx(float(np.percentile(values, p)))
    assert summary["mean"] == pytest.approx(4.5)
    assert summary["max"] == 9.0
    assert np.isnan(percentile([], 50))


def test_cpu_meter_and_idle_wait_return() -> None:
    meter = CpuMeter([os.getpid()])
    meter.start()
    end = time.process_time() + 0.05
    while time.process_time() < end:
        pass
    window = meter.stop()
    assert window.self_cores > 0.0
    assert window.watched_cores[os.getpid()] == pytest.approx(window.self_cores, abs=0.3)
    assert window.other_cores >= 0.0
    assert wait_idle(max_wait_s=0.0, window_s=0.05, threshold=1000.0, log=lambda _: None) < 1000.0


def _load(ips: float, p50: float, clients: int, other: float = 0.01) -> dict[str, Any]:
    return {
        "images_per_s": ips,
        "lat_ms": {"mean": p50, "p50": p50, "p95": p50 * 1.2, "p99": p50 * 1.5, "max": p50 * 2},
        "errors": {},
        "server_cores": 1.8,
        "loadgen_cores": 0.05,
        "loadgen_cpu_ms_per_req": 1.5,
        "machine_cores": 1.9,
        "other_cores": other,
        "concurrency": clients,
    }


def _raw(name: str, ips: float, p50: float) -> dict[str, Any]:
    return {
        "name": name,
        "iters": 100,
        "images_per_s": ips,
        "lat_ms": {"mean": p50, "p50": p50, "p95": p50, "p99": p50, "max": p50},
        "cores": 2.0,
        "other_cores": 0.0,
    }


def _fake_results() -> dict[str, Any]:
    raw = {
        "e2e-b1-t2": _raw("raw e2e b1", 31.0, 31.6),
        "e2e-b8-t2": _raw("raw e2e b8", 40.0, 200.0),
        "limit-b8": _raw("raw limit", 44.0, 180.0),
        "forward-b1-t2": _raw("raw forward b1", 34.0, 29.0),
    }
    pts = [
        ("predict-jpeg-multipart", 1, 30.0, 33.0, "e2e-b1-t2"),
        ("predict-jpeg-multipart", 8, 40.0, 200.0, "e2e-b8-t2"),
        ("predict-jpeg-multipart", 32, 41.0, 780.0, "e2e-b8-t2"),
        ("predict-tensor", 1, 33.0, 30.0, "forward-b1-t2"),
        ("lenet-predict", 1, 400.0, 2.5, None),
        ("activations-allconv-st", 1, 25.0, 40.0, "forward-b1-t2"),
        ("activations-1layer-json", 1, 20.0, 50.0, "forward-b1-t2"),
        ("activations-1layer-st", 1, 30.0, 32.0, "forward-b1-t2"),
        ("saliency-gradcam", 1, 10.0, 95.0, "forward-b1-t2"),
    ]
    points = [
        {
            "config": "throughput",
            "kind": kind,
            "label": kind,
            "concurrency": c,
            "baseline": base,
            "attempt": 1,
            "result": _load(ips, p50, c, other=0.5 if kind == "lenet-predict" else 0.01)
            | (
                {
                    "extra": {"resnet18.batches": 10.0, "resnet18.samples": 75.0, "lenet.batches": 0.0},
                    "server_cpu_ms": {"other": 0.04, "event loop": 3.7, "model": 58.8, "decode": 5.1},
                }
                if c == 32
                else {}
            ),
        }
        for kind, c, ips, p50, base in pts
    ]
    return {
        "configs": {"throughput": {"description": "2 x 1", "env": {"HOOKSERVE_WORKER_THREADS": "2"}}},
        "raw": raw,
        "points": points,
        "machine": {"cpu": "Fake CPU", "cores": 2},
    }


def test_one_client_target_uses_the_raw_row_with_the_configs_thread_count() -> None:
    results = _fake_results()
    results["raw"]["e2e-b1-t1"] = _raw("raw e2e b1 t1", 20.0, 50.0)
    results["raw"]["e2e-b1-t2-cl"] = _raw("raw e2e b1 cl", 35.0, 29.0)
    results["configs"]["throughput"]["env"]["HOOKSERVE_TORCH_THREADS"] = "1"
    got = {t.name: (t.limit, t.verdict) for t in evaluate_targets(results) if "JPEG, 1 client p50" in t.name}
    assert got == {"/predict JPEG, 1 client p50 (ms) <= raw e2e batch-1 (1 thread) p50 + 2": (52.0, "pass")}
    results["configs"]["throughput"]["env"]["HOOKSERVE_TORCH_THREADS"] = "2"
    got = {t.name: (t.limit, t.verdict) for t in evaluate_targets(results) if "JPEG, 1 client p50" in t.name}
    assert got == {
        "/predict JPEG, 1 client p50 (ms) <= raw e2e batch-1 (2 threads) p50 + 2": (33.6, "pass"),
        "/predict JPEG, 1 client p50 (ms) <= raw e2e batch-1 (2 threads) p50 + 2 [raw channels_last]": (31.0, "FAIL"),
    }


def test_report_rerendered_from_json_with_notes(tmp_path: Path) -> None:
    data = tmp_path / "RESULTS.json"
    data.write_text(json.dumps(_fake_results()))
    notes = tmp_path / "notes.md"
    notes.write_text("Measured by hand: **42**.\n")
    report_main([str(data), "--notes", str(notes)])
    md = (tmp_path / "RESULTS.md").read_text()
    assert md.endswith("## Notes\n\nMeasured by hand: **42**.\n")
    assert json.loads(data.read_text())["notes"] == "Measured by hand: **42**.\n"


def test_batch_metrics_parse() -> None:
    text = 'hookserve_batch_size_count{model="resnet18"} 12.0'
    found = BATCH_METRIC.match(text)
    assert found is not None
    assert (found["what"], found["model"], found["value"], found["hooked"]) == ("count", "resnet18", "12.0", None)
    hooked = BATCH_METRIC.match('hookserve_hooked_batch_size_sum{model="resnet18"} 30.0')
    assert hooked is not None
    assert (hooked["hooked"], hooked["what"]) == ("hooked_", "sum")
    assert BATCH_METRIC.match('hookserve_batch_size_bucket{model="resnet18",le="8.0"} 12.0') is None
    assert batches({"a.batches": 4.0, "a.samples": 10.0, "b.batches": 0.0, "b.samples": 0.0}) == (4, 2.5)
    assert batches({"a.batches": 0.0, "a.samples": 0.0, "a.hooked.batches": 5.0, "a.hooked.samples": 15.0}) == (5, 3.0)


def test_targets_on_fake_numbers() -> None:
    got = {t.name: (round(t.measured, 4), t.verdict) for t in evaluate_targets(_fake_results())}
    assert got == {
        "/predict JPEG, 8 clients / raw e2e batch 8": (1.0, "pass"),
        "/predict JPEG, 32 clients / raw e2e batch 8": (1.025, "pass"),
        "/predict JPEG, 32 clients / two single-thread forward limit": (round(41 / 44, 4), "FAIL"),
        "/predict JPEG, 1 client p50 (ms) <= raw e2e batch-1 (2 threads) p50 + 2": (33.0, "pass"),
        "lenet /predict, 1 client p50 (ms)": (2.5, "pass"),
        "/activations every Conv2d, safetensors / /predict (tensor) p50": (round(40 / 30, 4), "FAIL"),
        "/saliency gradcam / /predict (tensor) p50": (round(95 / 30, 4), "FAIL"),
        "/activations one layer JSON / safetensors p50": (round(50 / 32, 4), "FAIL"),
    }


def test_report_tables_on_fake_numbers() -> None:
    results = _fake_results()
    table = comparison_table(results)
    assert "| throughput | predict-jpeg-multipart | 32 | 41.0 | 780.0 |" in table
    assert "| raw e2e b8 | 1.02 | n/a |" in table  # 41 / 40; no p50 difference under load
    assert "| raw e2e b1 | 0.97 | 1.4 |" in table  # 30 / 31; 33.0 - 31.6
    assert "| None |" not in table
    assert "| n/a | n/a | n/a |" in table  # lenet: no raw row in these fake results
    cpu = cpu_table(results)
    assert "0.50 (noisy)" in cpu
    # 75 samples in 10 batches at 32 clients, and where the server's CPU went, roles in a fixed order
    assert "| 10 | 7.50 | model 58.8, decode 5.1, event loop 3.7, other 0.0 | 1 |" in cpu
    assert "| - | - | - | 1 |" in cpu  # no batch metrics or thread split for the others (older results)
    md = render_markdown(results)
    assert md.startswith("# hookserve benchmark\n")
    assert "## Serving targets against raw torch: 4 of 8 pass" in md
    assert "Fake CPU, 2 cores" in md
    assert "`HOOKSERVE_WORKER_THREADS=2`" in md
