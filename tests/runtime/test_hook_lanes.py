"""Hooked batches run side by side on the model's hook lanes, each seeing only its own hooks.

The model below meets a barrier inside its forward: two forwards can only both pass it when they
run at the same time (hooked forwards of inputs other than 8x8 meet). Requests of different sample
shapes never share a batch, so two of them sent together need two hooked batches at once (a lane
each) to answer at all.
"""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import httpx
import torch
from fastapi import FastAPI

from tests.conftest import as_tensor, tensor_input
from tests.helpers.serving import asgi_serving

MEETING_PY = """
import threading
import torch
from torch import nn

MEETING = threading.Barrier(2)


class Meeting(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Linear(4, 3)
        self.hooked_forwards_seen = []

    def forward(self, x):
        hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in self.modules())
        self.hooked_forwards_seen.append(hooks)
        y = self.conv(x)
        # not the load's own probes (at the input size), nor the service's shape propagation on meta tensors
        if hooks and x.shape[-1] != 8 and not x.is_meta:
            MEETING.wait(timeout=20)  # alone, this forward would wait in vain and fail
        return self.head(y.mean(dim=(2, 3)))
"""

CONFIG = """
[[models]]
name = "meeting"
source = "python"
architecture = "meeting.py:Meeting"
input_size = [3, 8, 8]
onnxruntime = false  # the tests count the forwards each module object runs, predictions' included
"""


def serve(model_dir: Path, **settings: Any) -> AbstractAsyncContextManager[tuple[FastAPI, httpx.AsyncClient]]:
    return asgi_serving(model_dir, {"meeting.py": MEETING_PY, "models.toml": CONFIG}, **settings)


def sample(side: int) -> torch.Tensor:
    return torch.randn(3, side, side, generator=torch.Generator().manual_seed(side))


def body(side: int, layers: list[str] | None = None) -> dict[str, Any]:
    found: dict[str, Any] = {"model": "meeting", "inputs": [tensor_input(sample(side))]}
    return found if layers is None else found | {"layers": layers}


def test_two_hooked_batches_run_at_once_each_with_its_own_hooks(tmp_path: Path) -> None:
    async def scenario() -> None:
        # one intra-op thread per job: a batch that starts alone may not take the second core the other needs
        async with serve(tmp_path, torch_threads=1) as (app, client):
            info = (await client.get("/models/meeting")).json()
            assert info["hook_lanes"] == 2  # one per worker thread
            model = app.state.hookserve.fleet.ready("meeting").model
            for copy in model.hookable_modules:
                copy.hooked_forwards_seen.clear()
            first, second = body(9, ["conv"]), body(10, ["conv", "head"])
            answers = await asyncio.gather(*(client.post("/activations", json=b) for b in (first, second)))
            assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
            assert list(answers[0].json()["activations"]) == ["conv"]
            assert list(answers[1].json()["activations"]) == ["conv", "head"]
            for side, answer in zip((9, 10), answers, strict=True):  # each its own rows, unmixed
                x = sample(side)[None]
                with torch.inference_mode():
                    want = model.module.conv(x)
                torch.testing.assert_close(as_tensor(answer.json()["activations"]["conv"]["output"]), want)
            lanes = [lane.hooked_forwards_seen for lane in model.lanes]
            # one forward per lane, each holding only its own batch's hooks: a pre- and a forward hook per
            # captured layer, and the check that someone still waits for the batch
            assert sorted(lanes) == [[1 + 2 * 1], [1 + 2 * 2]]
            assert model.module.hooked_forwards_seen == []  # the served module never ran hooked work
            assert (await client.get("/models/meeting")).json()["hooks"] == 0

    asyncio.run(scenario())


def test_with_one_worker_there_are_no_lanes_and_hooked_work_runs_on_the_served_module(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path, worker_threads=1) as (app, client):
            info = (await client.get("/models/meeting")).json()
            assert info["hook_lanes"] == 0
            model = app.state.hookserve.fleet.ready("meeting").model
            assert model.hookable_modules == (model.module,)
            model.module.hooked_forwards_seen.clear()
            captured = await client.post("/activations", json=body(8, ["conv"]))
            assert captured.status_code == 200, captured.text
            predicted = await client.post("/predict", json=body(8))
            assert predicted.status_code == 200, predicted.text
            assert model.module.hooked_forwards_seen == [1 + 2 * 1, 0]  # the capture's hooks, then none
            assert (await client.get("/models/meeting")).json()["hooks"] == 0

    asyncio.run(scenario())
