"""Tokens and heads in /activations, /interventions and /interventions/sweep on the shipped digits ViT, against
hooks written here: a [N, T, D] output is addressed by its tokens (dim 1) and channels (dim -1), a head by its
channels where the heads' outputs meet (the input of `attn.norm`, before the output projection)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from torch import Tensor, nn

from service.codecs.pictures import feature_grid_png
from tests.conftest import as_tensor, direct_capture, tensor_input
from tests.helpers.vit import vit_inputs

HEAD_DIM = 16


def vit(client: TestClient) -> nn.Module:
    return client.app.state.hookserve.fleet.ready("vit_digits").model.module  # type: ignore[attr-defined,no-any-return]


def post(client: TestClient, path: str, x: Tensor, **fields: Any) -> Any:
    r = client.post(path, json={"model": "vit_digits", "inputs": [tensor_input(row) for row in x], **fields})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize(
    ("tokens", "layer", "index"),
    [
        ([0, 3, 64], "blocks.2", [0, 3, 64]),
        ("patches", "blocks.0.mlp", list(range(1, 65))),
        ("prefix", "norm", [0]),
        ([1, 9], "patch_embed", [0, 8]),  # patch tokens alone: positions count from the whole sequence
    ],
)
def test_activations_keep_the_chosen_tokens(
    builtin_client: TestClient, tokens: Any, layer: str, index: list[int]
) -> None:
    x = vit_inputs(2, seed=21)
    capture = "output" if layer == "patch_embed" else "both"  # its input is the image
    body = post(builtin_client, "/activations", x, layers=[layer], tokens=tokens, capture=capture)
    want = direct_capture(vit(builtin_client), [layer], x, capture)[layer]
    got = body["activations"][layer]
    torch.testing.assert_close(as_tensor(got["output"]), want["output"][:, index], rtol=0, atol=1e-6)
    if capture == "both":  # the input side is chosen from too
        torch.testing.assert_close(as_tensor(got["input"]), want["input"][:, index], rtol=0, atol=1e-6)
    named = body["tokens"]
    assert named["grid"] == [8, 8]
    assert named["prefix"] == ["cls"]
    assert len(named["indices"]) == len(index)
    assert named["names"][0] in ("cls", "r0c0", "r0c1")
    assert builtin_client.get("/models/vit_digits").json()["hooks"] == 0


def test_reductions_of_tokens_go_over_the_tokens(builtin_client: TestClient) -> None:
    x = vit_inputs(2, seed=22)
    want = direct_capture(vit(builtin_client), ["blocks.1"], x)["blocks.1"]["output"]
    for reduce, fold in (("mean", want[:, 1:].mean(dim=1)), ("max", want[:, 1:].amax(dim=1))):
        body = post(builtin_client, "/activations", x, layers=["blocks.1"], tokens="patches", reduce=reduce)
        torch.testing.assert_close(as_tensor(body["activations"]["blocks.1"]["output"]), fold, rtol=1e-6, atol=1e-6)
    whole = post(builtin_client, "/activations", x, layers=["blocks.1"], reduce="mean")["activations"]
    torch.testing.assert_close(as_tensor(whole["blocks.1"]["output"]), want.mean(dim=1), rtol=1e-6, atol=1e-6)


def test_png_draws_token_outputs_on_the_patch_grid(builtin_client: TestClient) -> None:
    x = vit_inputs(1, seed=23)
    r = builtin_client.post(
        "/activations",
        json={"model": "vit_digits", "inputs": [tensor_input(x[0])], "layers": ["blocks.2"], "format": "png"},
    )
    assert r.status_code == 200, r.text
    tokens = direct_capture(vit(builtin_client), ["blocks.2"], x)["blocks.2"]["output"][0]
    assert r.content == feature_grid_png(tokens[1:].T.reshape(64, 8, 8), 64)


@pytest.mark.parametrize(
    ("model", "fields", "words"),
    [
        ("vit_digits", {"layers": ["head"], "tokens": [0]}, "'head' (output [10])"),
        ("vit_digits", {"layers": ["blocks.*"], "tokens": [0]}, "blocks.0.attn.q_norm"),
        ("vit_digits", {"layers": ["blocks.0"], "tokens": [65]}, "tokens [65] are out of range"),
        ("vit_digits", {"layers": ["blocks.0"], "tokens": "prefixes"}, "tokens"),
        ("vit_digits", {"nodes": ["add"], "tokens": [0]}, "tokens choose along the outputs of layers"),
        ("lenet", {"layers": ["conv1"], "tokens": [0]}, "lenet has no token sequence"),
    ],
)
def test_token_refusals_say_why(builtin_client: TestClient, model: str, fields: dict[str, Any], words: str) -> None:
    r = builtin_client.post("/activations", json={"model": model, "inputs": [tensor_input(vit_inputs(1)[0])], **fields})
    assert r.status_code == 422, r.text
    assert words in str(r.json()["detail"])


@contextmanager
def edited_input(module: nn.Module, edit: Callable[[Tensor], Tensor]) -> Iterator[None]:
    handle = module.register_forward_pre_hook(lambda m, args: (edit(args[0]),))
    try:
        yield
    finally:
        handle.remove()


@contextmanager
def edited_output(module: nn.Module, edit: Callable[[Tensor], Tensor]) -> Iterator[None]:
    handle = module.register_forward_hook(lambda m, args, out: edit(out))
    try:
        yield
    finally:
        handle.remove()


def logits_of(model: nn.Module, x: Tensor) -> Tensor:
    with torch.no_grad():
        out: Tensor = model(x)
    return out


def edited_logits(client: TestClient, x: Tensor, edits: list[dict[str, Any]], **fields: Any) -> Tensor:
    body = post(client, "/interventions", x, edits=edits, include_logits=True, top_k=1, **fields)
    return torch.tensor([p["logits"] for p in body["edited"]])


def head_channels(heads: list[int]) -> list[int]:
    return [c for h in heads for c in range(h * HEAD_DIM, (h + 1) * HEAD_DIM)]


def test_zeroing_and_scaling_heads_equal_hooks_on_the_heads_outputs(builtin_client: TestClient) -> None:
    x = vit_inputs(2, seed=24)
    model = copy.deepcopy(vit(builtin_client))
    norm = model.get_submodule("blocks.1.attn.norm")

    def zero(t: Tensor) -> Tensor:
        t = t.clone()
        t[..., head_channels([0, 2])] = 0
        return t

    with edited_input(norm, zero):
        want = logits_of(model, x)
    got = edited_logits(builtin_client, x, [{"site": "blocks.1.attn", "op": "zero", "heads": [0, 2]}])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)

    def scale(t: Tensor) -> Tensor:
        t = t.clone()
        t[:, 1:, head_channels([3])] *= 0.25
        return t

    with edited_input(norm, scale):
        want = logits_of(model, x)
    edit = {"site": "blocks.1.attn", "op": "scale", "factor": 0.25, "heads": [3], "tokens": "patches"}
    body = post(builtin_client, "/interventions", x, edits=[edit], include_logits=True)
    torch.testing.assert_close(torch.tensor([p["logits"] for p in body["edited"]]), want, rtol=1e-5, atol=1e-5)
    applied = body["applied"][0]
    assert (applied["site"], applied["heads"], applied["tokens"]) == ("blocks.1.attn", [3], list(range(1, 65)))
    assert applied["shape"] == [65, 64]
    assert applied["elements"] == 64 * HEAD_DIM
    assert builtin_client.get("/models/vit_digits").json()["hooks"] == 0


def test_patching_a_head_and_a_token_from_a_donor_equals_hooks(builtin_client: TestClient) -> None:
    x, donor = vit_inputs(2, seed=25), vit_inputs(1, seed=26)
    model = copy.deepcopy(vit(builtin_client))
    site, norm = model.get_submodule("blocks.2"), model.get_submodule("blocks.2.attn.norm")
    seen: dict[str, Tensor] = {}
    with (
        edited_input(norm, lambda t: seen.setdefault("heads", t.clone())),
        edited_output(site, lambda t: seen.setdefault("tokens", t.clone())),
    ):
        logits_of(model, donor)

    def patch_heads(t: Tensor) -> Tensor:
        t = t.clone()
        t[..., head_channels([1])] = seen["heads"][..., head_channels([1])]
        return t

    def patch_token(t: Tensor) -> Tensor:
        t = t.clone()
        t[:, [5, 6]] = seen["tokens"][:, [5, 6]]
        return t

    with edited_input(norm, patch_heads):
        want_heads = logits_of(model, x)
    with edited_output(site, patch_token):
        want_token = logits_of(model, x)
    sources = {"donor": [tensor_input(donor[0])]}
    heads = [{"site": "blocks.2.attn", "op": "patch", "heads": [1], "source": "donor"}]
    tokens = [{"site": "blocks.2", "op": "patch", "tokens": [5, 6], "source": "donor"}]
    torch.testing.assert_close(
        edited_logits(builtin_client, x, heads, sources=sources), want_heads, rtol=1e-5, atol=1e-5
    )
    torch.testing.assert_close(
        edited_logits(builtin_client, x, tokens, sources=sources), want_token, rtol=1e-5, atol=1e-5
    )


def test_channels_of_a_token_output_are_its_last_dim(builtin_client: TestClient) -> None:
    x = vit_inputs(1, seed=27)
    model = copy.deepcopy(vit(builtin_client))

    def zero(t: Tensor) -> Tensor:
        t = t.clone()
        t[:, [0], 7] = 0
        return t

    with edited_output(model.get_submodule("blocks.0"), zero):
        want = logits_of(model, x)
    got = edited_logits(builtin_client, x, [{"site": "blocks.0", "op": "zero", "tokens": [0], "channels": [7]}])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_sweep_over_heads_equals_each_head_zeroed_alone(builtin_client: TestClient) -> None:
    x = vit_inputs(2, seed=28)
    body = post(builtin_client, "/interventions/sweep", x, site="blocks.3.attn", over="heads", target=[2, 5])
    assert body["over"] == "heads"
    assert body["channels"] == []
    found = {effect["head"]: effect["deltas"] for effect in body["heads"]}
    assert sorted(found) == [0, 1, 2, 3]
    assert [e["delta"] for e in body["heads"]] == sorted(e["delta"] for e in body["heads"])
    clean = post(
        builtin_client,
        "/interventions",
        x,
        edits=[{"site": "blocks.3.attn", "op": "scale", "factor": 1.0, "heads": [0]}],
        include_logits=True,
    )
    for head, deltas in found.items():
        edited = post(
            builtin_client,
            "/interventions",
            x,
            edits=[{"site": "blocks.3.attn", "op": "zero", "heads": [head]}],
            target=[2, 5],
        )
        assert deltas == pytest.approx([c["delta"] for c in edited["change"]], abs=1e-5)
    assert clean["change"][0]["delta"] == pytest.approx(0.0, abs=1e-6)
    r = builtin_client.post(
        "/interventions/sweep",
        json={"model": "vit_digits", "inputs": [tensor_input(x[0])], "site": "blocks.3", "over": "heads"},
    )
    assert r.status_code == 422
    assert "attention module" in r.json()["detail"]
