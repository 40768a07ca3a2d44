"""The client's attention, tokens and head methods against a live server serving the digits ViT: each equals the
raw HTTP answer, whatever the wire, and the async client answers alike."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from service.client import AsyncClient, AttentionMaps, Client, TokenInfo
from service.zoo.lenet import samples_dir
from tests.client.test_client import array, b64
from tests.reliability.live_server import LiveServer

DIGIT_7 = samples_dir() / "digit_7.png"
DIGIT_3 = samples_dir() / "digit_3.png"


@pytest.fixture(scope="module")
def raw(live: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live.base_url, timeout=60, trust_env=False) as client:
        yield client


def raw_attention(raw: httpx.Client, **fields: object) -> dict[str, object]:
    body = {"model": "vit_digits", "inputs": [{"image": b64(DIGIT_7)}, {"image": b64(DIGIT_3)}], **fields}
    response = raw.post("/attention", json=body)
    assert response.status_code == 200, response.text
    answer: dict[str, object] = response.json()
    return answer


@pytest.mark.parametrize("wire", ["safetensors", "npz", "json"])
def test_attention_equals_the_raw_answer_on_every_wire(live: LiveServer, raw: httpx.Client, wire: str) -> None:
    want = raw_attention(raw, blocks=["blocks.1", "blocks.3"], heads=[2, 0], queries=[0, 10])
    with Client(live.base_url, wire=wire) as client:
        blocks = ["blocks.1", "blocks.3"]
        got = client.attention("vit_digits", [DIGIT_7, DIGIT_3], blocks=blocks, heads=[2, 0], queries=[0, 10])
    assert isinstance(got, AttentionMaps)
    assert got.tokens == TokenInfo(65, ["cls"], (8, 8), (4, 4))
    assert (got.heads, got.queries, got.query_names) == ([2, 0], [0, 10], ["cls", "r1c1"])
    maps = want["attention"]
    assert isinstance(maps, dict)
    assert list(got.maps) == list(maps) == ["blocks.1.attn", "blocks.3.attn"]
    for key, payload in maps.items():
        np.testing.assert_array_equal(got[key], array(payload))
    assert got.over_patches("blocks.3.attn").shape == (2, 2, 2, 8, 8)
    assert [p.top1.label for p in got.predictions] == ["7", "3"]
    assert got.to_torch()["blocks.1.attn"].shape == (2, 2, 2, 65)


def test_attention_image_tokens_rollout_and_head_sweeps(live: LiveServer) -> None:
    with Client(live.base_url) as client:
        image = client.attention_image("vit_digits", DIGIT_7, blocks=["blocks.0", "blocks.1"], heads=[0, 1, 2])
        assert image.size == (3 * 128 + 4, 2 * 128 + 2)
        acts = client.activations("vit_digits", DIGIT_7, ["blocks.2"], tokens="patches", reduce="mean")
        assert acts.output("blocks.2").shape == (1, 64)
        stats = client.activation_stats("vit_digits", DIGIT_7, ["blocks.2"], tokens=[0])
        assert stats.stats["blocks.2"]["output"].shape == [1, 1, 64]
        rollout = client.saliency("vit_digits", DIGIT_7, method="attention_rollout", params={"head_fusion": "max"})
        assert rollout.results[0].attribution.shape == (8, 8)
        assert rollout.results[0].tokens == TokenInfo(65, ["cls"], (8, 8), (4, 4))
        sweep = client.sweep(
            "vit_digits", [DIGIT_7, DIGIT_3], "blocks.2.attn", over="heads", heads=(1, 3), target=[7, 3]
        )
        assert sweep.over == "heads"
        assert sweep.channels == []
        assert sorted(h.head for h in sweep.heads or []) == [1, 2]
        edited = client.interventions("vit_digits", DIGIT_7, [{"site": "blocks.2.attn", "op": "zero", "heads": [1]}])
        assert edited.applied[0]["heads"] == [1]


def test_the_async_client_answers_alike(live: LiveServer) -> None:
    async def both() -> tuple[AttentionMaps[np.ndarray], AttentionMaps[np.ndarray]]:
        async with AsyncClient(live.base_url) as client:
            return await asyncio.gather(
                client.attention("vit_digits", DIGIT_7, queries="all"),
                client.attention("vit_digits", DIGIT_7, queries="all"),
            )

    first, second = asyncio.run(both())
    with Client(live.base_url) as client:
        sync = client.attention("vit_digits", DIGIT_7, queries="all")
    for key in sync.maps:
        np.testing.assert_array_equal(first[key], sync[key])
        np.testing.assert_array_equal(second[key], sync[key])
    assert sync["blocks.0.attn"].shape == (1, 4, 65, 65)
