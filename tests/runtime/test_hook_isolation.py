"""Concurrent requests through the real event loop never see each other's hooks or tensors (DESIGN.md invariants 1, 2).

The app runs under its own lifespan and is driven by `httpx.AsyncClient` over `ASGITransport`,
with every request of a round in flight at once (`asyncio.gather`).
"""

from __future__ import annotations

import asyncio
import base64
import io
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import httpx
import torch
from fastapi import FastAPI
from PIL import Image
from torch import Tensor, nn

from service.codecs.preprocess import preprocess_image
from service.zoo.lenet import lenet_preprocess_spec, load_lenet, samples_dir
from tests.conftest import assert_no_module_hooks, direct_capture, tensor_input, write_lenet
from tests.helpers.compare import assert_batched_close
from tests.helpers.serving import asgi_serving

# A python model that sleeps inside a layer (so jobs overlap in time) and records, at every
# forward, how many hooks its modules hold and the first feature of each row (a request tag).
SLOW_PY = """
import time
import torch
from torch import nn


class Sleepy(nn.Module):
    def __init__(self, seconds):
        super().__init__()
        self.seconds = seconds

    def forward(self, x):
        time.sleep(self.seconds)
        return x * 2.0


class Slow(nn.Module):
    def __init__(self, seconds=0.02):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.sleepy = Sleepy(seconds)
        self.head = nn.Linear(4, 3)
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g))
        self.seen = []

    def forward(self, x):
        hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in self.modules())
        self.seen.append((hooks, x[:, 0].tolist()))
        return self.head(self.sleepy(self.lin(x)))
"""

SLOW_TOML = """
[[models]]
name = "slow"
source = "python"
architecture = "slow.py:Slow"
input_size = [4]
max_batch_delay_ms = 2
"""


def serve(model_dir: Path) -> AbstractAsyncContextManager[tuple[FastAPI, httpx.AsyncClient]]:
    """The app with its lifespan running, and a client on the same event loop."""
    return asgi_serving(model_dir, {"slow.py": SLOW_PY, "models.toml": write_lenet(model_dir) + SLOW_TOML})


def served(app: FastAPI, name: str) -> nn.Module:
    module: nn.Module = app.state.hookserve.fleet.ready(name).model.module
    return module


def hookable(app: FastAPI, name: str) -> tuple[nn.Module, ...]:
    """The served module and the lanes hooked batches run on."""
    modules: tuple[nn.Module, ...] = app.state.hookserve.fleet.ready(name).model.hookable_modules
    return modules


async def assert_no_hooks(app: FastAPI, client: httpx.AsyncClient, name: str) -> None:
    assert (await client.get(f"/models/{name}")).json()["hooks"] == 0
    for module in hookable(app, name):
        assert_no_module_hooks(module)


def png_of(digit: int) -> bytes:
    return (samples_dir() / f"digit_{digit}.png").read_bytes()


def pixels(digit: int) -> Tensor:
    return preprocess_image(Image.open(io.BytesIO(png_of(digit))), lenet_preprocess_spec(), 3)


def assert_matches(answer: dict[str, Any], want: dict[str, dict[str, Tensor]], tag: str) -> None:
    got = answer["activations"]
    assert sorted(got) == sorted(want), tag
    for key, sides in want.items():
        assert sorted(got[key]) == sorted(sides), (tag, key)
        for side, expected in sides.items():
            actual = torch.tensor(got[key][side]["data"], dtype=torch.float32)
            assert_batched_close(actual, expected, f"{tag} {key}:{side}")


LAYER_SETS: list[list[str]] = [["conv1"], ["relu"], ["fc*"], ["pool", "fc3"], ["conv2", "relu"], [""], ["fc1"]]
CAPTURES = ["output", "input", "both"]


async def _lenet_round(tmp_path: Path) -> None:
    lenet = load_lenet()
    async with serve(tmp_path) as (app, client):
        assert app.state.hookserve.fleet.ready("lenet").model.preprocess == lenet_preprocess_spec()
        expected: list[tuple[str, Any, Any]] = []  # (kind, request body, expected result)
        gen = torch.Generator().manual_seed(42)
        for i in range(30):
            layers = LAYER_SETS[i % len(LAYER_SETS)]
            capture = CAPTURES[i % len(CAPTURES)]
            if i < 10:
                x = pixels(i)[None]
                inputs: list[dict[str, Any]] = [{"image": base64.b64encode(png_of(i)).decode()}]
            else:
                x = torch.randn(1 + i % 2, 3, 32, 32, generator=gen)
                inputs = [tensor_input(t) for t in x]
            patterns = [n for n, _ in lenet.named_modules() if n.startswith("fc")] if layers == ["fc*"] else layers
            body: dict[str, Any] = {"model": "lenet", "inputs": inputs, "layers": layers, "capture": capture}
            expected.append(("activations", body, direct_capture(lenet, patterns, x, capture)))
        for _ in range(12):
            x = torch.randn(1, 3, 32, 32, generator=gen)
            with torch.no_grad():
                logits = lenet(x)[0]
            body = {"model": "lenet", "inputs": [tensor_input(x[0])], "top_k": 3, "include_logits": True}
            expected.append(("predict", body, logits))
        for i in range(4):
            bad_layer = {"model": "lenet", "inputs": [tensor_input(torch.zeros(3, 32, 32))], "layers": [f"conv{i + 3}"]}
            expected.append(("fail", bad_layer, 422))
            bad_b64 = {"model": "lenet", "inputs": [{"image": "not*base64!"}], "layers": ["conv1"]}
            expected.append(("fail", bad_b64, 400))
        order = list(range(len(expected)))
        torch.manual_seed(0)
        order = [order[j] for j in torch.randperm(len(order)).tolist()]  # interleave the kinds

        async def send(index: int) -> httpx.Response:
            kind, body, _ = expected[index]
            return await client.post("/predict" if kind == "predict" else "/activations", json=body)

        responses = await asyncio.gather(*(send(j) for j in order))
        for index, response in zip(order, responses, strict=True):
            kind, body, want = expected[index]
            tag = f"request {index} ({kind})"
            if kind == "fail":
                assert response.status_code == want, (tag, response.text)
                continue
            assert response.status_code == 200, (tag, response.text)
            if kind == "predict":
                logits = torch.tensor(response.json()["predictions"][0]["logits"])
                torch.testing.assert_close(logits, want, rtol=0, atol=1e-5, msg=tag)
            else:
                assert_matches(response.json(), want, tag)
        await assert_no_hooks(app, client, "lenet")


def test_concurrent_activations_predictions_and_failures(tmp_path: Path) -> None:
    asyncio.run(_lenet_round(tmp_path))


async def _slow_round(tmp_path: Path) -> None:
    async with serve(tmp_path) as (app, client):
        model = served(app, "slow")
        reference: Any = type(model)(seconds=0.0)
        reference.load_state_dict(model.state_dict())
        reference.eval()
        copies: tuple[Any, ...] = hookable(app, "slow")  # Any: `seen` is a plain attribute
        assert len(copies) == 3  # the served module and one lane per worker thread
        for module in copies:
            module.seen.clear()
        gen = torch.Generator().manual_seed(7)

        jobs: list[tuple[str, dict[str, Any], Any]] = []
        for i in range(6):  # activations: tag 100 + i in the first feature
            x = torch.randn(1, 4, generator=gen)
            x[0, 0] = 100 + i
            layers = ["sleepy"] if i % 2 else ["lin", "sleepy", ""]
            body: dict[str, Any] = {
                "model": "slow",
                "inputs": [tensor_input(x[0])],
                "layers": layers,
                "capture": "both",
            }
            jobs.append(("activations", body, direct_capture(reference, layers, x, "both")))
        for i in range(14):  # predictions: tag -100 - i
            x = torch.randn(1, 4, generator=gen)
            x[0, 0] = -100 - i
            with torch.no_grad():
                logits = reference(x)[0]
            body = {"model": "slow", "inputs": [tensor_input(x[0])], "top_k": 3, "include_logits": True}
            jobs.append(("predict", body, logits))

        async def send(kind: str, body: dict[str, Any]) -> httpx.Response:
            return await client.post(f"/{kind}", json=body)

        # predictions first, then the activations while those are queued or running
        order = [j for j in range(len(jobs)) if jobs[j][0] == "predict"][:7] + list(range(6)) + list(range(13, 20))
        responses = await asyncio.gather(*(send(jobs[j][0], jobs[j][1]) for j in order))
        for index, response in zip(order, responses, strict=True):
            kind, _, want = jobs[index]
            assert response.status_code == 200, response.text
            if kind == "predict":
                logits = torch.tensor(response.json()["predictions"][0]["logits"])
                torch.testing.assert_close(logits, want, rtol=1e-6, atol=1e-5)  # batched: float rounding
            else:
                # one call per hooked layer: no prediction's forward fired this request's hooks
                assert_matches(response.json(), want, f"activations {index}")

        seen: list[tuple[int, list[float]]] = [call for module in copies for call in module.seen]
        assert all(call[0] == 0 for call in copies[0].seen)  # the served module: never hooked
        activation_calls = [(hooks, tags) for hooks, tags in seen if any(t >= 100 for t in tags)]
        prediction_calls = [(hooks, tags) for hooks, tags in seen if any(t <= -100 for t in tags)]
        assert sum(len(tags) for _, tags in activation_calls) == 6  # hooked requests may share a forward
        assert all(hooks > 0 and all(t >= 100 for t in tags) for hooks, tags in activation_calls)
        assert sum(len(tags) for _, tags in prediction_calls) == 14
        assert all(hooks == 0 for hooks, _ in prediction_calls), prediction_calls
        assert all(all(t <= -100 for t in tags) for _, tags in prediction_calls)  # never batched with a hooked job
        await assert_no_hooks(app, client, "slow")


def test_hooks_are_never_visible_to_a_concurrent_prediction(tmp_path: Path) -> None:
    asyncio.run(_slow_round(tmp_path))
