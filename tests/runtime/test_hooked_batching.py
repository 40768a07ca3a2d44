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
from tests.helpers.compare import assert_batched_close, assert_same_predictions
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


def _payload(t: Tensor) -> dict[str, Any]:
    """A tensor for an edit's `tensor` field (a bare payload, not an input item)."""
    payload: dict[str, Any] = tensor_input(t)["tensor"]
    return payload


def _logits(answer: dict[str, Any], key: str) -> Tensor:
    return torch.tensor([p["logits"] for p in answer[key]])


def _changes(answer: dict[str, Any]) -> Tensor:
    return torch.tensor(
        [[c["clean_score"], c["edited_score"], c["delta"], c["kl_divergence"]] for c in answer["change"]]
    )


def _assert_same_intervention(got: dict[str, Any], want: dict[str, Any], where: str) -> None:
    """A batched /interventions answer equals the same request's answer alone."""
    assert_same_predictions(got["clean"], want["clean"])
    assert_same_predictions(got["edited"], want["edited"])
    assert_batched_close(_logits(got, "edited"), _logits(want, "edited"), f"{where} edited")
    assert_batched_close(_logits(got, "clean"), _logits(want, "clean"), f"{where} clean")
    assert [(c["target"], c["label"]) for c in got["change"]] == [(c["target"], c["label"]) for c in want["change"]]
    torch.testing.assert_close(
        _changes(got), _changes(want), rtol=1e-5, atol=1e-4, msg=lambda m: f"{where} change: {m}"
    )
    assert got["applied"] == want["applied"], where
    assert (got.get("activations") is None) == (want.get("activations") is None), where
    for key, sides in (want.get("activations") or {}).items():
        assert sorted(got["activations"][key]) == sorted(sides), (where, key)
        for side, payload in sides.items():
            assert_batched_close(as_tensor(got["activations"][key][side]), as_tensor(payload), f"{where} {key}:{side}")


def _every_edit_op() -> list[dict[str, Any]]:
    """One /interventions body per edit op (and the variants of add, mean and patch), targets and captures mixed."""

    def sent(x: Tensor) -> list[dict[str, Any]]:
        return [tensor_input(t) for t in x]

    donor, donors = leaning(89, channel=0, value=-5.0, n=1), leaning(90, channel=2, value=5.0)
    assert not torch.equal(donors[0], donors[1])
    bodies: list[dict[str, Any]] = [
        {"inputs": sent(inputs(80, n=2)), "edits": [{"site": "conv1", "op": "zero", "channels": [0, 2]}]},
        {
            "inputs": sent(inputs(81, n=2)),
            "edits": [{"site": "conv2", "op": "scale", "factor": 2.5, "channels": [1, 3]}],
            "target": 3,
            "layers": ["fc"],
        },
        {"inputs": sent(inputs(82, n=2)), "edits": [{"site": "conv1", "op": "add", "value": 0.7}], "target": [0, 4]},
        {
            "inputs": sent(inputs(83, n=2)),
            "edits": [
                {
                    "site": "conv2",
                    "op": "add",
                    "channels": [0, 1, 2],
                    "tensor": _payload(torch.tensor([1.5, -2.0, 0.8])),
                }
            ],
        },
        {
            "inputs": sent(leaning(84, channel=1, value=3.0)),
            "edits": [
                {
                    "site": "conv1",
                    "op": "add",
                    "channels": [1, 2],
                    "y": [0, 4],
                    "x": [2, 6],
                    "tensor": _payload(inputs(184)[0, :2, :4, :4]),
                }
            ],
            "target": 2,
        },
        {
            "inputs": sent(inputs(85, n=2)),
            "edits": [{"site": "conv1", "op": "clamp", "min": -0.2, "max": 0.3}],
            "target": 2,
        },
        {
            "inputs": sent(inputs(86, n=2)),
            "edits": [{"site": "conv2", "op": "mean", "over": "spatial"}],
            "target": [1, 1],
        },
        {
            "inputs": sent(leaning(87, channel=0, value=4.0)),
            "edits": [{"site": "conv1", "op": "mean", "over": "batch", "channels": [0, 1]}],
        },
        {
            "inputs": sent(inputs(88, n=2)),
            "edits": [{"site": "conv2", "op": "noise", "std": 0.5, "seed": 7}],
            "target": 4,
        },
        {
            "inputs": sent(inputs(91, n=2)),
            "sources": {"donor": sent(donor)},  # one donor for both inputs
            "edits": [{"site": "conv2", "op": "patch", "source": "donor", "channels": [0, 5]}],
            "layers": ["fc"],
        },
        {
            "inputs": sent(inputs(92, n=2)),
            "sources": {"each": sent(donors)},  # one donor per input
            "edits": [{"site": "conv1", "op": "patch", "source": "each"}],
            "target": [2, 3],
        },
        {
            "inputs": sent(inputs(93, n=2)),
            "edits": [{"site": "conv2", "op": "set", "channels": [4], "tensor": _payload(inputs(193)[0, :1])}],
            "target": 0,
        },
    ]
    return [body | {"include_logits": True} for body in bodies]


def test_interventions_of_every_op_in_a_shared_batch_equal_each_alone(tmp_path: Path) -> None:
    """Every edit op, with targets of every kind, donors shared or per input and captures after the edits, in
    requests that share forwards: each answer equals the same request sent alone."""

    async def scenario() -> None:
        async with serve(tmp_path) as (app, client):
            model = toy(app)
            bodies = _every_edit_op()
            model.clear()
            responses = await post_all(app, client, "/interventions", bodies)
            rows = sum(len(b["inputs"]) for b in bodies)
            donors = sum(len(d) for b in bodies for d in b.get("sources", {}).values())
            assert model.sizes == [rows + donors, rows]  # all shared the reference forward, then the edited one
            for i, (response, body) in enumerate(zip(responses, bodies, strict=True)):
                assert response.status_code == 200, (i, response.text)
                alone = await client.post("/interventions", json={"model": "toy", **body})
                assert alone.status_code == 200, (i, alone.text)
                want = alone.json()
                edited, clean = _logits(want, "edited"), _logits(want, "clean")
                assert not torch.allclose(edited, clean, atol=1e-4), i  # it did edit
                assert ("fc" in (want.get("activations") or {})) == ("fc" in body.get("layers", [])), i
                _assert_same_intervention(response.json(), want, f"request {i} ({body['edits'][0]['op']})")

    run(scenario())


def _within_1e4(got: Any, want: Any, where: str) -> None:
    torch.testing.assert_close(
        torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=1e-4, msg=lambda message: f"{where}: {message}"
    )


SWEEPS: list[dict[str, Any]] = [
    {"site": "conv1", "op": "zero", "target": None},
    {"site": "conv2", "op": "mean", "target": 2},
    {"site": "conv2", "op": "zero", "channels": [1, 5], "target": [0, 4, 1]},
]


def test_concurrent_sweeps_over_several_inputs_equal_each_alone(tmp_path: Path) -> None:
    """Sweeps over three inputs each, sent together with an /interventions request: each sweep's ranking, targets
    and deltas equal the same sweep's alone."""

    async def scenario() -> None:
        async with serve(tmp_path) as (app, client):
            model = toy(app)
            sweeps = [
                {"model": "toy", "inputs": [tensor_input(t) for t in inputs(100 + i, n=3)], **sweep}
                for i, sweep in enumerate(SWEEPS)
            ]
            edit = {
                "model": "toy",
                "inputs": [tensor_input(t) for t in inputs(110, n=2)],
                "edits": [{"site": "conv1", "op": "zero", "channels": [1]}],
                "include_logits": True,
            }
            model.clear()
            sends = [client.post("/interventions/sweep", json=body) for body in sweeps]
            responses = await sent_while_held(executor(app), [*sends, client.post("/interventions", json=edit)])
            assert [r.status_code for r in responses] == [200] * len(responses), [r.text for r in responses]
            for i, (response, body) in enumerate(zip(responses, sweeps, strict=False)):
                alone = await client.post("/interventions/sweep", json=body)
                assert alone.status_code == 200, alone.text
                got, want = response.json(), alone.json()
                assert [got[k] for k in ("site", "call", "op", "targets")] == [
                    want[k] for k in ("site", "call", "op", "targets")
                ], i
                span = body.get("channels") or [0, 4 if body["site"] == "conv1" else 6]
                assert sorted(c["channel"] for c in want["channels"]) == list(range(*span)), i
                assert any(abs(c["delta"]) > 1e-3 for c in want["channels"]), i  # the ablations moved the score
                assert [c["channel"] for c in got["channels"]] == [c["channel"] for c in want["channels"]], i
                _within_1e4(got["clean_scores"], want["clean_scores"], f"sweep {i} clean_scores")
                for key in ("delta", "deltas"):
                    _within_1e4(
                        [c[key] for c in got["channels"]], [c[key] for c in want["channels"]], f"sweep {i} {key}"
                    )
            alone = await client.post("/interventions", json=edit)
            _assert_same_intervention(responses[-1].json(), alone.json(), "the intervention")

    run(scenario())
