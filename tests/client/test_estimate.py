"""`Client.estimate` / `AsyncClient.estimate`: a request's dry run, read into a `CostEstimate`; nothing runs."""

from __future__ import annotations

import asyncio
import base64

import httpx
import pytest

from service.client import AsyncClient, Client, CostEstimate, Wire
from service.zoo.lenet import samples_dir
from tests.reliability.live_server import LiveServer

DIGIT_7 = samples_dir() / "digit_7.png"


@pytest.mark.parametrize("wire", [Wire.safetensors, Wire.json])
def test_estimate_equals_the_raw_dry_run(live: LiveServer, wire: Wire) -> None:
    raw = httpx.post(
        f"{live.base_url}/saliency",
        json={
            "model": "lenet",
            "inputs": [{"image": base64.b64encode(DIGIT_7.read_bytes()).decode()}],
            "method": "occlusion",
            "window": [4, 4],
            "dry_run": True,
        },
        trust_env=False,
        timeout=60,
    ).json()
    with Client(live.base_url, wire=wire) as client:
        found = client.estimate("/saliency", "lenet", DIGIT_7, method="occlusion", window=[4, 4])
    assert found == CostEstimate.from_json(raw)
    assert found.forwards == raw["forwards"] > 1
    assert found.memory_bytes == sum(found.memory_parts.values())
    assert found.admitted


def test_the_async_client_estimates_too(live: LiveServer) -> None:
    async def estimate() -> CostEstimate:
        async with AsyncClient(live.base_url) as client:
            return await client.estimate("/predict", "lenet", [DIGIT_7, DIGIT_7], top_k=1)

    found = asyncio.run(estimate())
    assert found.forwards == 2
    assert found.backwards == 0
    assert found.rows_per_forward is None
