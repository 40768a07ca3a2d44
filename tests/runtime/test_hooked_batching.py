"""Concurrent hooked requests share one forward; each answer equals the same request run alone.

A long `max_batch_delay_ms` and requests sent together make the batching deterministic: a
forming batch waits for the requests still being decoded, and flushes once none is left.
"""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from fastapi import FastAPI
from torch import Tensor, nn

from service.introspection.attribution import compute_saliency, method_named
from service.introspection.gradients import compute_gradients
from service.runtime.executor import ModelExecutor
from tests.conftest import as_tensor, direct_capture, tensor_input
from tests.helpers.compare import assert_batched_close
from tests.helpers.serving import asgi_serving, sent_while_held

TOY_PY = '''
import torch
from torch import nn

class Toy(nn.Module):
    """conv -> shared relu -> conv -> shared relu -> pool -> fc; records the batch size of every forward."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1)
        self.conv2 = nn.Conv2d(4, 6, 3, padding=1)
        self.relu = nn.ReLU(inplace=True)
        self.pool = nn.AdaptiveAvgPool2d(2)
        self.fc = nn.Linear(24, 5)
        self.unused = nn.Linear(5, 5)
        self.sizes = []
        self.grad_at_conv2 = []

    def forward(self, x):
        self.sizes.append(int(x.shape[0]))
        y = self.relu(self.conv1(x))
        self.grad_at_conv2.append(torch.is_grad_enabled())
        y = self.relu(self.conv2(y))
        return self.fc(torch.flatten(self.pool(y), 1))
'''

CONFIG = """
[[models]]
name = "toy"
source = "python"
architecture = "toy.py:Toy"
input_size = [3, 8, 8]
max_batch_delay_ms = 10000
max_batch_size = 64
{extra}
"""


def serve(model_dir: Path, extra: str = "") -> AbstractAsyncContextManager[tuple[FastAPI, httpx.AsyncClient]]:
    return asgi_serving(model_dir, {"toy.py": TOY_PY, "models.toml": CONFIG.format(extra=extra)})


class Records:
    """What every copy of the served Toy recorded: the served module (predictions, the reference for
    expected answers) and the lanes hooked batches run on, each with recording lists of its own."""

    def __init__(self, app: FastAPI) -> None:
        self.copies: tuple[Any, ...] = app.state.hookserve.fleet.ready("toy").model.hookable_modules

    @property
    def module(self) -> nn.Module:
        served: nn.Module = self.copies[0]
        return served

    @property
    def sizes(self) -> list[int]:
        """The batch of every hooked forward: those on the lanes (references run on the served module)."""
        return [size for copy in self.copies[1:] for size in copy.sizes]

    @property
    def grad_at_conv2(self) -> list[bool]:
        return [flag for copy in self.copies for flag in copy.grad_at_conv2]

    def clear(self) -> None:
        for copy in self.copies:
            copy.sizes.clear()
            copy.grad_at_conv2.clear()


def toy(app: FastAPI) -> Records:
    return Records(app)


def executor(app: FastAPI) -> ModelExecutor:
    found: ModelExecutor = app.state.hookserve.fleet.ready("toy").executor
    return found


def inputs(seed: int, n: int = 1, side: int = 8) -> Tensor:
    return torch.randn(n, 3, side, side, generator=torch.Generator().manual_seed(seed))


async def post_all(
    app: FastAPI, client: httpx.AsyncClient, path: str, bodies: list[dict[str, Any]], queued: int | None = None
) -> list[httpx.Response]:
    """Concurrent requests, released to the workers once `queued` of them (default all) wait in the queue."""
    sends = [client.post(path, json={"model": "toy", **b}) for b in bodies]
    return await sent_while_held(executor(app), sends, queued)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


CAPTURES: list[tuple[list[str], str, str | None]] = [
    (["conv1"], "output", None),
    (["relu"], "both", None),  # the shared relu: relu and relu#2
    (["conv2", "fc"], "input", None),
    (["conv1", "conv2"], "output", "mean"),
    ([""], "output", None),
    (["pool", "relu"], "both", "flatten"),
]


def test_activations_of_concurrent_requests_share_a_forward_and_equal_their_own(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path) as (app, client):
            model = toy(app)
            model.clear()
            bodies, wants = [], []
            for i, (layers, capture, reduce) in enumerate(CAPTURES):
                x = inputs(i, n=1 + i % 2)
                bodies.append(
                    {"inputs": [tensor_input(t) for t in x], "layers": layers, "capture": capture, "reduce": reduce}
                )
                want = direct_capture(model.module, layers, x, capture)
                if reduce is not None:
                    want = {k: {s: _reduce(t, reduce) for s, t in v.items()} for k, v in want.items()}
                wants.append(want)
            responses = await post_all(app, client, "/activations", bodies)
            for i, (response, want) in enumerate(zip(responses, wants, strict=True)):
                assert response.status_code == 200, response.text
                got = response.json()["activations"]
                assert list(got) == list(want), i  # its own layers and calls, in forward order
                for key, sides in want.items():
                    assert sorted(got[key]) == sorted(sides), (i, key)
                    for side, tensor in sides.items():
                        assert_batched_close(as_tensor(got[key][side]), tensor, f"request {i} {key}:{side}")
            assert model.sizes == [sum(1 + i % 2 for i in range(len(CAPTURES)))]  # all shared one forward
            assert (await client.get("/models/toy")).json()["hooks"] == 0

    run(scenario())


def test_two_concurrent_activation_requests_share_a_forward_and_each_gets_its_own_rows(tmp_path: Path) -> None:
    """A batch of exactly two requests (the test above batches six): one forward, split back by request."""

    async def scenario() -> None:
        async with serve(tmp_path) as (app, client):
            model = toy(app)
            model.clear()
            xs = [inputs(10), inputs(11)]
            bodies = [{"inputs": [tensor_input(t) for t in x], "layers": ["conv1"]} for x in xs]
            responses = await post_all(app, client, "/activations", bodies)
            assert [r.status_code for r in responses] == [200, 200], [r.text for r in responses]
            assert model.sizes == [2]
            for response, x in zip(responses, xs, strict=True):
                got = as_tensor(response.json()["activations"]["conv1"]["output"])
                assert_batched_close(got, direct_capture(model.module, ["conv1"], x)["conv1"]["output"])

    run(scenario())


def _reduce(t: Tensor, how: str) -> Tensor:
    if how == "flatten":
        return t.reshape(t.shape[0], -1)
    return t.mean(dim=tuple(range(2, t.ndim))) if t.ndim > 2 else t


def test_inputs_of_other_sizes_are_never_merged(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path) as (app, client):
            model = toy(app)
            model.clear()
            small, large = inputs(1, n=2), inputs(2, n=3, side=12)
            bodies = [
                {"inputs": [tensor_input(t) for t in small], "layers": ["conv1"]},
                {"inputs": [tensor_input(t) for t in large], "layers": ["conv1"]},
            ]
            responses = await post_all(app, client, "/activations", bodies)
            assert [r.status_code for r in responses] == [200, 200]
            assert sorted(model.sizes) == [2, 3]
            got = as_tensor(responses[1].json()["activations"]["conv1"]["output"])
            assert_batched_close(got, direct_capture(model.module, ["conv1"], large)["conv1"]["output"])

    run(scenario())


def test_gradients_of_concurrent_requests_each_with_its_own_targets(tmp_path: Path) -> None:
    cases: list[tuple[list[str], Any, bool]] = [
        (["conv2"], None, False),
        (["conv1", "relu"], 3, True),
        ([], [0, 4], True),
        (["fc"], 1, False),
    ]

    async def scenario() -> None:
        async with serve(tmp_path) as (app, client):
            model = toy(app)
            model.clear()
            bodies, wants = [], []
            for i, (layers, target, include_input) in enumerate(cases):
                x = inputs(10 + i, n=2)
                body = {"inputs": [tensor_input(t) for t in x], "layers": layers, "include_input": include_input}
                bodies.append(body | {"target": target})
                wants.append(
                    compute_gradients(model.module, x, layers, target=target, labels=None, include_input=include_input)
                )
            responses = await post_all(app, client, "/gradients", bodies)
            assert model.sizes == [8]  # all four shared one forward
            for i, (response, want) in enumerate(zip(responses, wants, strict=True)):
                assert response.status_code == 200, response.text
                out = response.json()
                assert out["targets"] == want.targets, i
                assert list(out["gradients"]) == list(want.gradients), i
                for key, value in want.gradients.items():
                    assert_batched_close(as_tensor(out["gradients"][key]), value, f"request {i} {key}")

    run(scenario())


SALIENCY: list[dict[str, Any]] = [
    {"method": "gradient", "target": 1},
    {"method": "gradient", "target": None},
    {"method": "input_x_gradient", "target": [2, 0]},
    {"method": "gradcam", "target": 3},
    {"method": "gradcam", "target": None, "layer": "conv1"},
    {"method": "smoothgrad", "target": 1, "samples": 4, "seed": 1},
    {"method": "smoothgrad", "target": 2, "samples": 6, "seed": 9, "noise": 0.3},
    {"method": "integrated_gradients", "target": 4, "steps": 8},
    {"method": "integrated_gradients", "target": 0, "steps": 8},
]


def test_saliency_of_concurrent_requests_equals_each_alone(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path) as (app, client):
            model = toy(app)
            settings = app.state.hookserve.settings
            bodies, wants = [], []
            for i, request in enumerate(SALIENCY):
                x = inputs(20 + i, n=2)
                bodies.append({"inputs": [tensor_input(t) for t in x], **request})
                params = method_named(request["method"]).params.model_validate(
                    {k: v for k, v in request.items() if k != "target"}
                )
                with torch.no_grad():
                    top = model.module(x).argmax(1).tolist()
                target = request["target"]
                targets = top if target is None else target if isinstance(target, list) else [target] * 2
                wants.append(compute_saliency(model.module, x, params, targets, settings=settings))
            before = executor(app).stats.hooked_batches
            responses = await post_all(app, client, "/saliency", bodies)
            batches = executor(app).stats.hooked_batches - before
            assert batches < len(SALIENCY)  # like requests shared batches
            for i, (response, want) in enumerate(zip(responses, wants, strict=True)):
                assert response.status_code == 200, response.text
                results = response.json()["results"]
                assert [r["target"] for r in results] == [w.target for w in want], i
                for got, item in zip(results, want, strict=True):
                    assert_batched_close(as_tensor(got["attribution"]), item.attribution, f"request {i} attribution")
                    assert_batched_close(as_tensor(got["heatmap"]), item.heatmap, f"request {i} heatmap")
            assert (await client.get("/models/toy")).json()["hooks"] == 0

    run(scenario())


def test_invalid_requests_are_refused_before_joining_and_failures_stay_their_own(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path) as (app, client):
            x = inputs(30, n=1)
            good = {"inputs": [tensor_input(x[0])], "layers": ["conv1"]}
            bodies = [
                good,
                {"inputs": [tensor_input(x[0])], "layers": ["conv9"]},  # unknown: 422 before any batch
                {"inputs": [tensor_input(x[0])], "layers": ["unused"]},  # never runs: fails inside the batch
                {"inputs": [tensor_input(x[0])], "layers": ["conv1"], "target": 7},  # 5 classes: 422 up front
                good,
            ]
            responses = await post_all(app, client, "/gradients", bodies, queued=3)  # two are refused up front
            assert [r.status_code for r in responses] == [200, 422, 422, 422, 200]
            assert "conv9" in responses[1].text
            assert "'unused' produced no differentiable tensor" in responses[2].text
            assert "out of range" in responses[3].text
            assert responses[0].json()["gradients"].keys() == responses[4].json()["gradients"].keys()
            assert (await client.get("/models/toy")).json()["hooks"] == 0

    run(scenario())


def test_a_model_may_opt_out_of_batched_introspection(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path, "batch_introspection = false") as (app, client):
            model = toy(app)
            model.clear()
            bodies = [{"inputs": [tensor_input(t) for t in inputs(40 + i, n=2)], "layers": ["conv1"]} for i in range(4)]
            responses = await post_all(app, client, "/activations", bodies)
            assert [r.status_code for r in responses] == [200] * 4
            assert model.sizes == [2, 2, 2, 2]

    run(scenario())


@pytest.mark.parametrize(
    ("path", "body", "graph_before_conv2"),
    [
        ("/saliency", {"method": "gradcam", "layer": "conv2"}, False),
        ("/gradients", {"layers": ["conv2"], "include_input": False}, False),
        ("/gradients", {"layers": ["conv2"], "include_input": True}, True),
        ("/saliency", {"method": "gradient"}, True),
    ],
)
def test_autograd_starts_where_the_first_gradient_is_asked_for(
    tmp_path: Path, path: str, body: dict[str, Any], graph_before_conv2: bool
) -> None:
    """Grad-CAM and layer gradients run the forward without autograd up to their layer; input gradients need it all."""

    async def scenario() -> None:
        async with serve(tmp_path) as (app, client):
            model = toy(app)
            model.clear()
            response = await client.post(path, json={"model": "toy", "inputs": [tensor_input(inputs(50)[0])], **body})
            assert response.status_code == 200, response.text
            assert model.grad_at_conv2 == [graph_before_conv2]

    run(scenario())


def leaning(seed: int, channel: int, value: float, n: int = 2) -> Tensor:
    """Inputs pushed towards another class than plain noise gives (the toy's top-1 is mostly class 1)."""
    x = 0.1 * inputs(seed, n=n)
    x[:, channel] += value
    return x


def test_gradients_without_a_target_take_each_requests_own_top_1_in_a_shared_batch(tmp_path: Path) -> None:
    """`target: null` is each row's own arg-max, for every request of a batch, not only the first one's."""

    async def scenario() -> None:
        async with serve(tmp_path) as (app, client):
            model = toy(app)
            xs = [leaning(60, channel=1, value=-5.0), inputs(61, n=2)]
            with torch.no_grad():
                tops = [model.module(x).argmax(1).tolist() for x in xs]
            assert tops[0] != tops[1]  # else taking one request's top-1 for the other could not show
            model.clear()
            bodies = [{"inputs": [tensor_input(t) for t in x], "layers": ["conv2"], "target": None} for x in xs]
            responses = await post_all(app, client, "/gradients", bodies)
            assert model.sizes == [4]  # one shared forward
            for i, (response, x, top) in enumerate(zip(responses, xs, tops, strict=True)):
                assert response.status_code == 200, response.text
                out = response.json()
                assert out["targets"] == top, i
                want = compute_gradients(model.module, x, ["conv2"], target=None, labels=None, include_input=False)
                assert_batched_close(as_tensor(out["gradients"]["conv2"]), want.gradients["conv2"], f"request {i}")

    run(scenario())


def test_interventions_of_concurrent_requests_each_read_their_own_clean_rows_and_donors(tmp_path: Path) -> None:
    """A batch `mean` averages the request's own clean inputs and a `patch` takes each input's own donor row, when
    the requests share forwards: each answer equals the same request sent alone."""

    def logits(answer: dict[str, Any], key: str) -> Tensor:
        return torch.tensor([p["logits"] for p in answer[key]])

    async def scenario() -> None:
        async with serve(tmp_path) as (app, client):
            model = toy(app)
            mean = {"site": "conv1", "op": "mean", "over": "batch", "channels": [0, 1, 2, 3]}
            patch = {"site": "conv2", "op": "patch", "source": "donor"}
            bodies: list[dict[str, Any]] = [
                {"inputs": [tensor_input(t) for t in leaning(70, channel=1, value=-5.0)], "edits": [mean]},
                {"inputs": [tensor_input(t) for t in leaning(71, channel=0, value=5.0)], "edits": [mean]},
                {
                    "inputs": [tensor_input(t) for t in inputs(72, n=2)],
                    "sources": {"donor": [tensor_input(t) for t in leaning(73, channel=0, value=-5.0)]},
                    "edits": [patch],
                },
            ]
            bodies = [body | {"include_logits": True} for body in bodies]
            model.clear()
            responses = await post_all(app, client, "/interventions", bodies)
            assert model.sizes == [8, 6]  # the reference forward (with the donors), then the edited one
            for i, (response, body) in enumerate(zip(responses, bodies, strict=True)):
                assert response.status_code == 200, response.text
                alone = await client.post("/interventions", json={"model": "toy", **body})
                assert alone.status_code == 200, alone.text
                got, want = response.json(), alone.json()
                assert not torch.allclose(logits(want, "edited"), logits(want, "clean"), atol=1e-4), i  # it did edit
                assert_batched_close(logits(got, "edited"), logits(want, "edited"), f"request {i} edited")
                assert_batched_close(logits(got, "clean"), logits(want, "clean"), f"request {i} clean")

    run(scenario())
