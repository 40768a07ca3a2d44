"""Concurrent /attention and attention-method /saliency requests share one hooked batch on the digits ViT, and
each answer equals the same request run alone: its own rows, blocks, heads, query rows, targets and parameters."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import torch

from tests.conftest import as_tensor, tensor_input
from tests.helpers.compare import assert_batched_close
from tests.helpers.serving import asgi_serving, sent_while_held
from tests.helpers.vit import vit_inputs, write_vit

Cases = list[tuple[torch.Tensor, dict[str, Any]]]

ATTENTION: Cases = [  # (inputs, fields): blocks, heads and queries that differ from request to request
    (vit_inputs(2, seed=1), {"blocks": ["blocks.0", "blocks.2"], "queries": "all"}),
    (vit_inputs(1, seed=2), {"blocks": ["blocks.2"], "heads": [3, 0], "queries": [5, 0, 64]}),
    (vit_inputs(3, seed=3), {}),
]
SALIENCY: Cases = [
    (vit_inputs(2, seed=4), {"method": "attention_rollout", "target": [1, 2]}),
    (vit_inputs(1, seed=5), {"method": "attention_rollout", "head_fusion": "max", "discard_ratio": 0.5}),
    (vit_inputs(2, seed=6), {"method": "attention_rollout", "head_fusion": "min", "target": 3}),
]
CHEFER: Cases = [
    (vit_inputs(2, seed=7), {"method": "gradient_weighted_attention", "target": [4, 9]}),
    (vit_inputs(1, seed=8), {"method": "gradient_weighted_attention"}),
]


def post(client: httpx.AsyncClient, path: str, x: torch.Tensor, fields: dict[str, Any]) -> Any:
    return client.post(path, json={"model": "vit", "inputs": [tensor_input(row) for row in x], **fields})


def test_batched_attention_and_attention_methods_equal_each_request_alone(tmp_path: Path) -> None:
    async def scenario() -> None:
        files = {"models.toml": write_vit(tmp_path, max_batch_delay_ms=10000.0, max_batch_size=64)}
        async with asgi_serving(tmp_path, files) as (app, client):
            executor = app.state.hookserve.fleet.ready("vit").executor
            cases: list[tuple[str, Cases, str]] = [
                ("/attention", ATTENTION, "attention"),
                ("/saliency", SALIENCY, "results"),
                ("/saliency", CHEFER, "results"),
            ]
            for path, requests, part in cases:
                alone = [await post(client, path, x, fields) for x, fields in requests]
                before = executor.stats.hooked_batches
                together = await sent_while_held(executor, [post(client, path, x, f) for x, f in requests])
                assert executor.stats.hooked_batches - before == 1, path  # one batch for all of them
                for i, (one, batched) in enumerate(zip(alone, together, strict=True)):
                    assert one.status_code == batched.status_code == 200, batched.text
                    want, got = one.json(), batched.json()
                    if part == "attention":
                        for field in ("tokens", "heads", "queries", "query_names"):
                            assert got[field] == want[field], field
                        assert list(got[part]) == list(want[part])
                        for key in want[part]:
                            assert_batched_close(as_tensor(got[part][key]), as_tensor(want[part][key]), f"{i} {key}")
                    else:
                        for g, w in zip(got[part], want[part], strict=True):
                            assert (g["target"], g["tokens"]) == (w["target"], w["tokens"])
                            assert_batched_close(as_tensor(g["attribution"]), as_tensor(w["attribution"]), str(i))
                            assert_batched_close(as_tensor(g["heatmap"]), as_tensor(w["heatmap"]), str(i))
            assert (await client.get("/models/vit")).json()["hooks"] == 0

    asyncio.run(scenario())
