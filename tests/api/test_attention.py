"""POST /attention on the built-in transformers, against timm's own `AttentionExtract` on the same weights."""

from __future__ import annotations

import io
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from PIL import Image

from service.codecs.pictures import MIN_GRID_TILE
from service.introspection.attention import fused_flags
from tests.conftest import as_tensor, b64, read_binary_answer, sample_png, tensor_input
from tests.helpers.vit import timm_attention, vit_inputs

DIGIT = {"image": b64(sample_png(7))}


def served(client: TestClient, name: str) -> Any:
    return client.app.state.hookserve.fleet.ready(name).model  # type: ignore[attr-defined]


def attention(client: TestClient, name: str, x: torch.Tensor, **fields: Any) -> Any:
    body = {"model": name, "inputs": [tensor_input(row) for row in x], **fields}
    return client.post("/attention", json=body)


def assert_fused_everywhere(client: TestClient, name: str) -> None:
    """Every attention module of the served module and of every hook lane has its fused kernel back."""
    model = served(client, name)
    assert len(model.lanes) == 2
    for module in model.hookable_modules:
        flags = fused_flags(module)
        assert flags
        assert all(flags.values()), [n for n, on in flags.items() if not on]


@pytest.mark.parametrize(("name", "size", "n"), [("vit_digits", 32, 3), ("vit_tiny", 224, 1)])
def test_probabilities_equal_timm_attention_extract(builtin_client: TestClient, name: str, size: int, n: int) -> None:
    x = vit_inputs(n, seed=5, size=size)
    r = attention(builtin_client, name, x, queries="all", format="safetensors")
    assert r.status_code == 200, r.text
    tensors, rest = read_binary_answer(r.content, "safetensors")
    want = timm_attention(served(builtin_client, name).module, x)
    assert list(rest["attention"]) == list(want)  # every block, in order
    assert tensors.keys() == want.keys()
    for key, reference in want.items():
        got = tensors[key]
        assert got.shape == reference.shape
        assert float((got - reference).abs().max()) <= 1e-6 * float(reference.abs().max()), key
        torch.testing.assert_close(got.sum(-1), torch.ones(got.shape[:-1]), rtol=0, atol=1e-5)
    layout = rest["tokens"]
    assert layout["count"] == x.shape[-1] ** 2 // layout["patch_size"][0] ** 2 + 1
    assert layout["prefix"] == ["cls"]
    assert rest["queries"] == list(range(layout["count"]))
    assert builtin_client.get(f"/models/{name}").json()["hooks"] == 0
    assert_fused_everywhere(builtin_client, name)


def test_heads_queries_and_blocks_are_slices_of_the_whole_map(builtin_client: TestClient) -> None:
    x = vit_inputs(2, seed=1)
    want = timm_attention(served(builtin_client, "vit_digits").module, x)
    r = attention(builtin_client, "vit_digits", x, blocks=["blocks.2"])  # a block names its attention module
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["queries"], body["query_names"], body["heads"]) == ([0], ["cls"], [0, 1, 2, 3])
    assert list(body["attention"]) == ["blocks.2.attn"]
    torch.testing.assert_close(as_tensor(body["attention"]["blocks.2.attn"]), want["blocks.2.attn"][:, :, :1])
    r = attention(builtin_client, "vit_digits", x, blocks=["blocks.[13]*"], heads=[3, 1], queries=[9, 0])
    body = r.json()
    assert list(body["attention"]) == ["blocks.1.attn", "blocks.3.attn"]
    assert body["query_names"] == ["r1c0", "cls"]
    for key, got in body["attention"].items():
        torch.testing.assert_close(as_tensor(got), want[key][:, [3, 1]][:, :, [9, 0]])
    patches = attention(builtin_client, "vit_digits", x, blocks=["blocks.0.attn"], queries="patches").json()
    assert patches["queries"] == list(range(1, 65))
    torch.testing.assert_close(as_tensor(patches["attention"]["blocks.0.attn"]), want["blocks.0.attn"][:, :, 1:])


def test_formats_agree_and_the_png_is_a_row_per_block_and_a_column_per_head(builtin_client: TestClient) -> None:
    fields = {"model": "vit_digits", "inputs": [DIGIT, DIGIT], "blocks": ["blocks.0", "blocks.3"], "heads": [0, 2]}
    as_json = builtin_client.post("/attention", json=fields).json()
    for fmt in ("safetensors", "npz"):
        r = builtin_client.post("/attention", json=fields | {"format": fmt})
        tensors, rest = read_binary_answer(r.content, fmt)
        assert rest["attention"]["blocks.3.attn"] == {"shape": [2, 2, 1, 65], "dtype": "float32"}
        for key, got in tensors.items():
            torch.testing.assert_close(got, as_tensor(as_json["attention"][key]), rtol=0, atol=0)
    stats = builtin_client.post("/attention", json=fields | {"format": "stats"}).json()["attention"]["blocks.0.attn"]
    full = as_tensor(as_json["attention"]["blocks.0.attn"])
    assert stats["shape"] == [2, 2, 1, 65]
    assert stats["max"] == pytest.approx(float(full.max()))
    assert stats["mean"] == pytest.approx(1 / 65, rel=1e-5)  # each row sums to one over 65 keys
    png = builtin_client.post("/attention", json=fields | {"format": "png"})
    assert png.headers["content-type"] == "image/png"
    image = Image.open(io.BytesIO(png.content))
    tile = MIN_GRID_TILE  # the 32 px digit enlarged 4x
    assert image.size == (2 * tile + 2, 2 * tile + 2)  # 2 blocks x 2 heads, 2 px between tiles
    assert builtin_client.get("/models/vit_digits").json()["hooks"] == 0


def test_multipart_like_curl(builtin_client: TestClient) -> None:
    r = builtin_client.post(
        "/attention",
        data={"model": "vit_digits", "blocks": "blocks.1,blocks.2", "heads": "0", "queries": "all", "format": "stats"},
        files=[("image", ("digit.png", sample_png(3), "image/png"))],
    )
    assert r.status_code == 200, r.text
    assert r.json()["attention"]["blocks.2.attn"]["shape"] == [1, 1, 65, 65]


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"model": "lenet"}, ["lenet has no attention modules"]),
        ({"model": "efficientvit_b0"}, ["LiteMLA", "linear attention", "never forms attention probabilities"]),
        ({"model": "vit_digits", "heads": [4]}, ["heads [4] are out of range", "4"]),
        ({"model": "vit_digits", "blocks": ["blocks.0.mlp"]}, ["'blocks.0.mlp' holds no attention module"]),
        ({"model": "vit_digits", "blocks": ["blokcs.0"]}, ["unknown layer 'blokcs.0'", "closest"]),
        ({"model": "vit_digits", "queries": [65]}, ["tokens [65] are out of range", "cls then 8 x 8 patches"]),
        ({"model": "vit_digits", "queries": "nope"}, ["queries"]),
    ],
)
def test_refusals_say_why(builtin_client: TestClient, fields: dict[str, Any], words: list[str]) -> None:
    r = builtin_client.post("/attention", json={"inputs": [DIGIT], **fields})
    assert r.status_code == 422, r.text
    detail = str(r.json()["detail"])
    assert all(word in detail for word in words), detail


def test_fused_attention_comes_back_after_a_failed_forward(builtin_client: TestClient) -> None:
    """A sample shape the digits ViT cannot run fails inside the unfused forward: a 422, every flag restored."""
    r = attention(builtin_client, "vit_digits", vit_inputs(1, size=40), queries="all")
    assert r.status_code == 422, r.text
    assert "cannot run on samples of shape [3, 40, 40]" in r.json()["detail"]
    assert builtin_client.get("/models/vit_digits").json()["hooks"] == 0
    assert_fused_everywhere(builtin_client, "vit_digits")
    assert attention(builtin_client, "vit_digits", vit_inputs(1)).status_code == 200
    predict = builtin_client.post(
        "/predict", json={"model": "vit_digits", "inputs": [tensor_input(vit_inputs(1, size=40)[0])]}
    )
    assert predict.status_code == 422, predict.text  # timm asserts the input size: the client's mistake, not a 500
