"""Soak: a few thousand mixed requests from 16 concurrent clients against a live uvicorn serving LeNet,
with large legal introspection requests (every layer of a wide convolution, both sides) among them.

Bounds checked: zero 5xx, no hook left registered, the server's RSS grows by less than
RSS_GROWTH_BOUND (320 MiB) between the end of a warm-up and the end of the run (each once idle), its peak RSS
stays within the memory budget of requests in flight (MEMORY_BUDGET) plus PEAK_SLACK, and
every answer carries its own request's tensors (each request sends a distinct input whose
logits were computed in-process beforehand; predict logits, the fc3 activation, gradient
scores and saliency scores must all equal that input's own logits).
"""

from __future__ import annotations

import asyncio
import base64
import io
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil
import torch

from service.zoo.lenet import load_lenet
from tests.conftest import write_lenet
from tests.helpers.wide import WIDE_PY
from tests.reliability.live_server import LiveServer

CLIENTS = 16
REQUESTS = 4000
WARMUP = 800
TIME_BUDGET_S = 90.0
# Allocator noise, not leaks: measured 33-204 MiB after this warm-up (126 at most on an idle machine, 204 with
# mutation testing beside it), 143-185 MiB on the code before the allocator trim (150 failed half its runs). A
# leak of one capture per large request (128 of them, tens of MB each) or of ~100 KB per request still fails it.
RSS_GROWTH_BOUND = 320 * 1024 * 1024
MEMORY_BUDGET = 256 * 1024 * 1024  # what requests in flight may hold together (HOOKSERVE_MEMORY_BUDGET_BYTES)
# The server's own peak beyond the budget: models, threads, allocator slack. Measured 748-792 MiB above idle in
# all (9 runs, before and after the allocator trim): 512 MiB of slack failed about one run in three.
PEAK_SLACK = 640 * 1024 * 1024
ATOL = 1e-4

WIDE_TOML = """
[[models]]
name = "wide"
source = "python"
architecture = "wide.py:Wide"
input_size = [3, 192, 192]
"""
WIDE_INPUT = torch.rand(2, 3, 192, 192, generator=torch.Generator().manual_seed(1))
LARGE_EVERY = 25  # one request in 25 is a large one


def settled_rss(process: psutil.Process, window_s: float = 2.0) -> int:
    """The server's lowest RSS over `window_s` once it is idle: the allocator trim that follows the last answers
    runs on its own thread, so a single reading right after them could land before or after it."""
    lowest = int(process.memory_info().rss)
    deadline = time.monotonic() + window_s
    while time.monotonic() < deadline:
        time.sleep(0.1)
        lowest = min(lowest, int(process.memory_info().rss))
    return lowest


@dataclass
class Outcome:
    kind: str
    status: int
    problem: str | None = None


def _tensor(x: torch.Tensor) -> dict[str, Any]:
    data = base64.b64encode(x.numpy().tobytes()).decode()
    return {"tensor": {"shape": list(x.shape), "dtype": "float32", "b64": data}}


def _close(got: Any, want: torch.Tensor) -> bool:
    return torch.allclose(torch.tensor(got, dtype=torch.float32), want, atol=ATOL, rtol=1e-4)


Check = Callable[[httpx.Response], str | None]
Request = tuple[str, str, str, dict[str, Any], Check]


def _predicted(want: torch.Tensor, top: int, r: httpx.Response) -> str | None:
    pred = r.json()["predictions"][0]
    ok = pred["top_k"][0]["index"] == top and _close(pred["logits"], want)
    return None if ok else f"predict answer is not this input's: {pred}"


def _activation(want: torch.Tensor, r: httpx.Response) -> str | None:
    out = r.json()["activations"]["fc3"]["output"]
    return None if _close(out["data"], want[None]) else "fc3 activation is not this input's"


def _gradient(want: torch.Tensor, top: int, r: httpx.Response) -> str | None:
    answer = r.json()
    ok = answer["targets"] == [top] and _close(answer["scores"], want[top : top + 1])
    shapes = answer["gradients"]["fc1"]["shape"] == [1, 120]
    return None if ok and shapes else f"gradients answer is not this input's: {answer['scores']}"


def _saliency(want: torch.Tensor, top: int, r: httpx.Response) -> str | None:
    result = r.json()["results"][0]
    ok = result["target"] == top and abs(result["score"] - float(want[top])) < ATOL
    return None if ok else "saliency score is not this input's"


def _download(bias: np.ndarray, r: httpx.Response) -> str | None:
    array = np.load(io.BytesIO(r.content), allow_pickle=False)
    return None if np.array_equal(array, bias) else "fc3.bias download differs"


def _stats(want: torch.Tensor, r: httpx.Response) -> str | None:
    out = r.json()["activations"]["fc3"]["output"]
    return None if abs(out["mean"] - float(want.mean())) < ATOL else "fc3 stats are not this input's"


def _wide_stats(r: httpx.Response) -> str | None:
    sides = r.json()["activations"]["conv"]
    return None if sides["output"]["shape"] == [2, 64, 192, 192] else "the wide capture has the wrong shape"


def _status(expected: int, r: httpx.Response) -> str | None:
    return None if r.status_code == expected else f"expected {expected}, got {r.status_code}"


def build_requests(inputs: torch.Tensor, logits: torch.Tensor, fc3_bias: np.ndarray) -> list[Request]:
    """(kind, method, url, httpx kwargs, check) for request i; check returns a problem or None."""
    bad_image = {"model": "lenet", "inputs": [{"image": "not base64 at all!"}]}
    wide = {"model": "wide", "inputs": [_tensor(t) for t in WIDE_INPUT], "layers": ["*"], "capture": "both"}
    requests: list[Request] = []
    for i in range(len(inputs)):
        want = logits[i]
        top = int(want.argmax())
        body: dict[str, Any] = {"model": "lenet", "inputs": [_tensor(inputs[i])]}
        gradients = body | {"layers": ["fc1"], "include_input": False}
        kinds: list[Request] = [
            ("predict", "POST", "/predict", {"json": body | {"include_logits": True}}, partial(_predicted, want, top)),
            ("activations", "POST", "/activations", {"json": body | {"layers": ["fc3"]}}, partial(_activation, want)),
            ("gradients", "POST", "/gradients", {"json": gradients}, partial(_gradient, want, top)),
            ("saliency", "POST", "/saliency", {"json": body | {"method": "gradient"}}, partial(_saliency, want, top)),
            ("state-dict", "GET", "/models/lenet/state-dict?key=fc3.bias&format=npy", {}, partial(_download, fc3_bias)),
            ("activations-stats", "POST", "/activations", {"json": body | {"layers": ["fc3"], "format": "stats"}},
             partial(_stats, want)),
            ("bad-base64", "POST", "/predict", {"json": bad_image}, partial(_status, 400)),
            ("bad-layer", "POST", "/activations", {"json": body | {"layers": ["conv9"]}}, partial(_status, 422)),
        ]  # fmt: skip
        large = ("large-activations", "POST", "/activations", {"json": wide | {"format": "stats"}}, _wide_stats)
        requests.append(large if i % LARGE_EVERY == LARGE_EVERY - 1 else kinds[i % len(kinds)])
    return requests


async def run_all(base_url: str, requests: list[Request], deadline: float) -> list[Outcome]:
    outcomes: list[Outcome] = []
    pending = iter(requests)

    async def client_loop(client: httpx.AsyncClient) -> None:
        for kind, method, url, kwargs, check in pending:
            if time.monotonic() > deadline:
                return
            r = await client.request(method, url, **kwargs)
            problem = None
            if r.status_code == 200 or kind.startswith("bad"):
                problem = check(r)
            else:
                problem = f"status {r.status_code}: {r.text[:200]}"
            outcomes.append(Outcome(kind, r.status_code, problem))

    limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=CLIENTS)
    async with httpx.AsyncClient(base_url=base_url, timeout=60, limits=limits) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(CLIENTS)))
    return outcomes


def test_soak_mixed_requests_from_16_clients(tmp_path: Path) -> None:
    lenet = load_lenet()
    generator = torch.Generator().manual_seed(6)
    inputs = torch.randn(WARMUP + REQUESTS, 3, 32, 32, generator=generator)
    with torch.no_grad():
        logits = lenet(inputs)
    fc3_bias = lenet.fc3.bias.detach().numpy()
    requests = build_requests(inputs, logits, fc3_bias)
    env = {
        "HOOKSERVE_WORKER_THREADS": "2",
        "HOOKSERVE_CPU_THREADS": "2",
        "HOOKSERVE_DECODE_THREADS": "2",
        "HOOKSERVE_MEMORY_BUDGET_BYTES": str(MEMORY_BUDGET),
    }
    (tmp_path / "wide.py").write_text(WIDE_PY)
    with LiveServer(tmp_path, write_lenet(tmp_path) + WIDE_TOML, env=env) as server:
        process = psutil.Process(server.pid)
        rss_idle = process.memory_info().rss
        started = time.monotonic()
        warm = asyncio.run(run_all(server.base_url, requests[:WARMUP], started + TIME_BUDGET_S))
        rss_after_warmup = settled_rss(process)
        outcomes = asyncio.run(run_all(server.base_url, requests[WARMUP:], started + TIME_BUDGET_S))
        rss_at_end = settled_rss(process)
        peak = server.peak_rss_bytes()
        elapsed = time.monotonic() - started
        info = httpx.get(f"{server.base_url}/models/lenet", timeout=10).json()
        log = server.log()
    everything = warm + outcomes
    statuses = Counter(o.status for o in everything)
    assert len(outcomes) >= REQUESTS // 2, f"only {len(outcomes)} requests in {elapsed:.0f} s"
    assert not [o for o in everything if o.status >= 500], (statuses, log)
    problems = [f"{o.kind}: {o.problem}" for o in everything if o.problem]
    assert not problems, problems[:10]
    assert {o.kind for o in outcomes} == {
        "predict",
        "activations",
        "gradients",
        "saliency",
        "state-dict",
        "activations-stats",
        "bad-base64",
        "bad-layer",
        "large-activations",
    }
    assert info["hooks"] == 0
    assert info["status"] == "ready"
    growth = rss_at_end - rss_after_warmup
    assert growth < RSS_GROWTH_BOUND, f"server RSS grew by {growth / 2**20:.0f} MiB (peak {peak / 2**20:.0f} MiB)"
    above = peak - rss_idle
    assert above < MEMORY_BUDGET + PEAK_SLACK, f"peak RSS {above / 2**20:.0f} MiB above idle"
    assert "Traceback" not in log
