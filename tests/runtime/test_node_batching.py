"""Concurrent /activations requests naming FX nodes share one run of the node graph; each gets exactly its own rows.

One worker, held until every request is queued, makes the batching deterministic. The toy
records the batch of every run through a `torch.fx.wrap`ped function: a leaf of the traced
graph, called with real tensors on every forward, eager or traced.
"""

from __future__ import annotations

import asyncio
import copy
import sys
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import httpx
import torch
from fastapi import FastAPI
from torch import Tensor, nn
from torchvision.models.feature_extraction import create_feature_extractor

from tests.conftest import as_tensor, direct_capture, tensor_input
from tests.helpers.compare import assert_batched_close
from tests.helpers.serving import asgi_serving, sent_while_held

TOY_PY = '''
import torch
import torch.nn.functional as F
from torch import nn

RUNS = []


def record(x):
    RUNS.append(int(x.shape[0]))
    return x


torch.fx.wrap("record")


class Toy(nn.Module):
    """conv -> functional relu -> conv + residual -> flatten -> fc; `record` notes each run's batch."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1)
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(2)
        self.fc = nn.Linear(16, 5)

    def forward(self, x):
        y = F.relu(self.conv1(record(x)))
        y = self.conv2(y) + y
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
"""


def serve(model_dir: Path) -> AbstractAsyncContextManager[tuple[FastAPI, httpx.AsyncClient]]:
    """One worker thread (so no hook lanes): every concurrent request joins the one forming batch."""
    return asgi_serving(model_dir, {"toy.py": TOY_PY, "models.toml": CONFIG}, worker_threads=1)


def toy(app: FastAPI) -> nn.Module:
    module: nn.Module = app.state.hookserve.fleet.ready("toy").model.module
    return module


def runs(model: nn.Module) -> list[int]:
    """The batch of every forward since the last `clear` (the toy file's module-level list)."""
    found: list[int] = sys.modules[type(model).__module__].RUNS
    return found


def inputs(seed: int, n: int) -> Tensor:
    return torch.randn(n, 3, 8, 8, generator=torch.Generator().manual_seed(seed))


def by_nodes(model: nn.Module, nodes: list[str], x: Tensor) -> dict[str, dict[str, Tensor]]:
    """torchvision's extractor on a copy (it switches the model to train and back to trace both graphs)."""
    with torch.inference_mode():
        found = create_feature_extractor(copy.deepcopy(model), nodes)(x)
    return {name: {"output": t} for name, t in found.items()}


# (layers, nodes, capture, reduce): node-only, layer-only and both, with their own reductions and sides
REQUESTS: list[tuple[list[str], list[str], str, str | None]] = [
    ([], ["add", "flatten"], "output", None),
    (["conv1"], [], "input", None),
    ([], ["relu"], "output", "mean"),
    (["conv2"], ["add"], "both", None),
    ([], ["conv*"], "output", "flatten"),
    ([], ["x", "fc"], "output", None),
]


def test_node_requests_share_one_graph_run_and_each_gets_its_own_rows(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path) as (app, client):
            assert (await client.get("/models/toy/nodes")).status_code == 200  # traced before the burst
            model = toy(app)
            batches = app.state.hookserve.fleet.ready("toy").executor.stats.hooked_batches
            bodies, wants = [], []
            for i, (layers, nodes, capture, reduce) in enumerate(REQUESTS):
                x = inputs(i, n=1 + i % 3)
                body: dict[str, Any] = {"inputs": [tensor_input(t) for t in x], "capture": capture, "reduce": reduce}
                want: dict[str, dict[str, Tensor]] = {}
                if layers:
                    body["layers"] = layers
                    want |= direct_capture(model, layers, x, capture)
                if nodes:
                    body["nodes"] = nodes
                    names = [n for n in ("x", "conv1", "relu", "conv2", "add", "flatten", "fc") if _match(n, nodes)]
                    want |= by_nodes(model, names, x)
                if reduce is not None:
                    want = {k: {s: _reduce(t, reduce) for s, t in v.items()} for k, v in want.items()}
                bodies.append(body)
                wants.append(want)
            runs(model).clear()  # the references above ran the same `record`
            held = app.state.hookserve.fleet.ready("toy").executor
            responses = await sent_while_held(
                held, [client.post("/activations", json={"model": "toy", **b}) for b in bodies]
            )
            for i, (response, want) in enumerate(zip(responses, wants, strict=True)):
                assert response.status_code == 200, response.text
                got = response.json()["activations"]
                assert list(got) == list(want), i  # its own sites: layers' keys first, then nodes in graph order
                for key, sides in want.items():
                    assert sorted(got[key]) == sorted(sides), (i, key)
                    for side, tensor in sides.items():
                        assert_batched_close(as_tensor(got[key][side]), tensor, f"request {i} {key}:{side}")
            total = sum(1 + i % 3 for i in range(len(REQUESTS)))
            with_layers = sum(1 + i % 3 for i, r in enumerate(REQUESTS) if r[0])
            with_nodes = sum(1 + i % 3 for i, r in enumerate(REQUESTS) if r[1])
            assert app.state.hookserve.fleet.ready("toy").executor.stats.hooked_batches == batches + 1
            assert sorted(runs(model)) == sorted([with_layers, with_nodes])  # one eager run, one graph run
            assert with_layers < total
            assert with_nodes < total  # each run took only the rows of the requests that need it
            assert (await client.get("/models/toy")).json()["hooks"] == 0

    asyncio.run(scenario())


def _match(name: str, patterns: list[str]) -> bool:
    return any(name == p or (p.endswith("*") and name.startswith(p[:-1])) for p in patterns)


def _reduce(t: Tensor, how: str) -> Tensor:
    if how == "flatten":
        return t.reshape(t.shape[0], -1)
    return t.mean(dim=tuple(range(2, t.ndim))) if t.ndim > 2 else t
