"""Two concurrent /saliency requests of each newer method share one hooked batch, and each answer equals the same
request run alone (rows with their own targets, and their own parameters where the method's batch key allows).

The two requests queue behind a job that holds the model until both are queued, so that they meet in one
batch however slowly either is parsed and decoded."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor

from service.config import Settings
from service.introspection.attribution import compute_saliency, method_named
from service.runtime.runners.saliency import plain_copy
from tests.conftest import as_tensor, tensor_input
from tests.helpers.captum_reference import NEW_METHODS
from tests.helpers.compare import assert_batched_close
from tests.helpers.serving import asgi_serving

TOY_PY = '''
import torch
from torch import nn

class Toy(nn.Module):
    """conv-relu-conv-relu-maxpool-avgpool-fc on 3x8x8, one module per call (DeepLift takes it)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(4, 6, 3, padding=1)
        self.relu2 = nn.ReLU()
        self.maxpool = nn.MaxPool2d(2)
        self.pool = nn.AdaptiveAvgPool2d(2)
        self.fc = nn.Linear(24, 5)

    def forward(self, x):
        y = self.maxpool(self.relu2(self.conv2(self.relu1(self.conv1(x)))))
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

PAIRS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {  # two requests that may share a batch
    "occlusion": ({"window": [3, 3], "strides": [2, 2]}, {"window": [1, 4, 4], "baseline": 0.3}),
    "feature_ablation": ({"groups": "grid", "cell": [2, 4]}, {"segments": 6, "baseline": -0.2}),
    "guided_backprop": ({}, {}),
    "deconvolution": ({}, {}),
    "guided_gradcam": ({"layer": "conv1"}, {"layer": "conv1"}),
    "deeplift": ({"baseline": 0.0}, {"baseline": 0.4}),
    "gradient_shap": ({"samples": 3, "seed": 1}, {"samples": 5, "seed": 2, "noise": 0.2, "baselines": [0.0, 1.0]}),
    "layer_conductance": ({"layer": "conv2", "steps": 5}, {"layer": "conv2", "steps": 5}),
    "layer_integrated_gradients": ({"layer": "conv2", "steps": 5}, {"layer": "conv2", "steps": 5}),
    "neuron_gradient": ({"neuron": [1, 2, 3]}, {"neuron": [1, 2, 3]}),
}


def inputs(seed: int, n: int) -> Tensor:
    return torch.randn(n, 3, 8, 8, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("method", NEW_METHODS)
def test_two_concurrent_requests_share_a_batch_and_each_equals_itself_alone(tmp_path: Path, method: str) -> None:
    settings = Settings(worker_threads=2, decode_threads=2)

    async def scenario() -> None:
        async with asgi_serving(tmp_path, {"toy.py": TOY_PY, "models.toml": CONFIG}) as (app, client):
            served = app.state.hookserve.fleet.ready("toy")
            requests = [(inputs(1, 2), [4, 0], PAIRS[method][0]), (inputs(2, 1), [2], PAIRS[method][1])]
            wants = []
            for x, targets, fields in requests:
                params = method_named(method).params.model_validate({"method": method, **fields})
                plain = plain_copy(served.model)  # what the server's perturbation forwards run on
                wants.append(compute_saliency(served.model.module, x, params, targets, settings=settings, plain=plain))
            executor = served.executor
            before = executor.stats.hooked_batches
            started, gate = threading.Event(), threading.Event()

            def hold() -> None:  # holds the eager module until both requests are queued behind it
                started.set()
                gate.wait(timeout=30)

            holder = asyncio.ensure_future(executor.run_exclusive(hold))
            while not started.is_set():
                await asyncio.sleep(0.005)
            posts = asyncio.gather(
                *(
                    client.post(
                        "/saliency",
                        json={
                            "model": "toy",
                            "method": method,
                            "inputs": [tensor_input(t) for t in x],
                            "target": targets,
                            **fields,
                        },
                    )
                    for x, targets, fields in requests
                )
            )
            while executor.queue_depth < 2 and not posts.done():
                await asyncio.sleep(0.005)
            gate.set()
            await holder
            responses = await posts
            assert executor.stats.hooked_batches - before == 1  # the two shared one batch
            for i, (response, want) in enumerate(zip(responses, wants, strict=True)):
                assert response.status_code == 200, response.text
                results = response.json()["results"]
                assert [r["target"] for r in results] == [w.target for w in want]
                for got, item in zip(results, want, strict=True):
                    assert_batched_close(as_tensor(got["attribution"]), item.attribution, f"request {i}")
                    assert_batched_close(as_tensor(got["heatmap"]), item.heatmap, f"request {i} heatmap")
                    if item.convergence_delta is not None:
                        assert got["convergence_delta"] == pytest.approx(item.convergence_delta, abs=1e-6)
            assert (await client.get("/models/toy")).json()["hooks"] == 0

    asyncio.run(scenario())
