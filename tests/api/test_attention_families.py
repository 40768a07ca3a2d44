"""Other timm transformer families through /attention: DeiT (class and distillation tokens), a ViT with register
tokens, BEiT (relative position bias) and EVA (rotary embeddings) equal timm's `AttentionExtract`; Swin's window
attention is refused by name. Small configurations of each, random weights."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient

from service.config import Settings
from service.introspection.attention import fused_flags
from service.main import create_app
from tests.conftest import read_binary_answer, tensor_input, wait_settled
from tests.helpers.config import toml_value
from tests.helpers.vit import timm_attention, vit_inputs

SMALL = {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2}
FAMILIES: dict[str, tuple[str, dict[str, Any], list[str]]] = {  # name: (architecture, kwargs, prefix tokens)
    "deit": ("deit_tiny_distilled_patch16_224", SMALL, ["cls", "dist"]),
    "registers": ("vit_small_patch16_224", SMALL | {"reg_tokens": 2}, ["cls", "reg0", "reg1"]),
    "beit": ("beit_base_patch16_224", SMALL, ["cls"]),
    "eva": ("eva02_tiny_patch14_224", SMALL, ["cls"]),
}
SWIN = ("swin_tiny_patch4_window7_224", {"img_size": 56, "embed_dim": 32, "depths": [1, 1], "num_heads": [1, 2]})


def entry(name: str, architecture: str, kwargs: dict[str, Any], size: int) -> str:
    return f"""
[[models]]
name = "{name}"
source = "timm"
architecture = "{architecture}"
kwargs = {toml_value(kwargs)}
input_size = [3, {size}, {size}]
"""


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    model_dir = tmp_path_factory.mktemp("families")
    config = "".join(entry(name, arch, kwargs, 32) for name, (arch, kwargs, _) in FAMILIES.items())
    config += entry("swin", *SWIN, 56)
    (model_dir / "models.toml").write_text(config)
    settings = Settings(model_dir=model_dir, config=model_dir / "models.toml", worker_threads=2, torch_threads=1)
    with TestClient(create_app(settings)) as c:
        wait_settled(c)
        yield c


@pytest.mark.parametrize("name", list(FAMILIES))
def test_each_family_equals_attention_extract(client: TestClient, name: str) -> None:
    x = vit_inputs(2, seed=31)
    body = {"model": name, "inputs": [tensor_input(row) for row in x], "queries": "all", "format": "safetensors"}
    r = client.post("/attention", json=body)
    assert r.status_code == 200, r.text
    tensors, rest = read_binary_answer(r.content, "safetensors")
    assert rest["tokens"]["prefix"] == FAMILIES[name][2]
    assert rest["tokens"]["grid"] == [4, 4]
    module = client.app.state.hookserve.fleet.ready(name).model.module  # type: ignore[attr-defined]
    want = timm_attention(module, x)
    assert list(rest["attention"]) == list(want)
    for key, reference in want.items():
        got = tensors[key]
        assert float((got - reference).abs().max()) <= 1e-6 * float(reference.abs().max()), key
    assert client.get(f"/models/{name}").json()["hooks"] == 0


def test_heads_of_a_deit_are_edited_where_they_meet(client: TestClient) -> None:
    x = vit_inputs(1, seed=32)
    body = {"model": "deit", "inputs": [tensor_input(x[0])], "include_logits": True}
    edits = [{"site": "blocks.1.attn", "op": "zero", "heads": [0, 1]}]
    r = client.post("/interventions", json=body | {"edits": edits})
    assert r.status_code == 200, r.text
    assert r.json()["applied"][0]["shape"] == [18, 32]  # cls, dist and 16 patches


def test_swin_window_attention_is_refused_by_name(client: TestClient) -> None:
    r = client.post("/attention", json={"model": "swin", "inputs": [tensor_input(torch.zeros(3, 56, 56))]})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert "WindowAttention" in detail
    assert "windows" in detail


def test_every_copy_keeps_the_fused_kernel_between_requests(client: TestClient) -> None:
    for name in FAMILIES:
        model = client.app.state.hookserve.fleet.ready(name).model  # type: ignore[attr-defined]
        for module in model.hookable_modules:
            assert all(fused_flags(module).values()), name
