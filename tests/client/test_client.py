"""`Client` against a live server: every method equals the raw HTTP answer, and every wire agrees."""

from __future__ import annotations

import base64
import dataclasses
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.numpy import save as safetensors_save

from service.client import Client, Wire
from service.client.tensors import read_safetensors
from service.zoo.lenet import samples_dir, weights_path
from tests.client.servers import TOKEN, slow_tensor
from tests.reliability.live_server import LiveServer

DIGIT_7 = samples_dir() / "digit_7.png"
DIGIT_3 = samples_dir() / "digit_3.png"


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def array(payload: dict[str, Any]) -> np.ndarray:
    return np.asarray(payload["data"], dtype=np.float32).reshape(payload["shape"])


@pytest.fixture(scope="module")
def raw(live: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live.base_url, timeout=60, trust_env=False) as client:
        yield client


@pytest.fixture(scope="module")
def client(live: LiveServer) -> Iterator[Client]:
    with Client(live.base_url, token=TOKEN) as c:
        yield c


def matches(mine: Any, theirs: Any) -> bool:
    """A typed result equals a JSON answer: same values; fields the answer leaves out are None in the result."""
    if dataclasses.is_dataclass(mine) and not isinstance(mine, type):
        mine = dataclasses.asdict(mine)
    if isinstance(mine, dict) and isinstance(theirs, dict):
        extra = mine.keys() - theirs.keys()
        return all(mine[k] is None for k in extra) and all(k in mine and matches(mine[k], v) for k, v in theirs.items())
    if isinstance(mine, list) and isinstance(theirs, list):
        return len(mine) == len(theirs) and all(matches(a, b) for a, b in zip(mine, theirs, strict=True))
    return bool(mine == theirs)


def post(raw: httpx.Client, path: str, **body: Any) -> Any:
    response = raw.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json()


# ---- every method equals the raw answer -----------------------------------------------------


def test_health_and_models_equal_the_raw_answers(client: Client, raw: httpx.Client) -> None:
    health = client.health()
    ready = raw.get("/readyz")
    assert (health.live, health.ready, health.status) == (True, ready.status_code == 200, ready.json()["status"])
    assert [m.to_json() for m in client.models()] == raw.get("/models").json()["models"]
    detail = client.model("lenet")
    assert detail.to_json() == raw.get("/models/lenet").json()
    assert detail.repr is not None
    assert "Conv2d" in detail.repr
    assert (detail.num_classes, detail.labels, detail.optimizer) == (10, True, "SGD")


def test_predict_equals_the_raw_answer(client: Client, raw: httpx.Client) -> None:
    expected = post(raw, "/predict", model="lenet", inputs=[{"image": b64(DIGIT_7)}, {"image": b64(DIGIT_3)}], top_k=3)
    got = client.predict("lenet", [DIGIT_7, DIGIT_3], top_k=3)
    assert got.model == "lenet"
    assert matches(got.predictions, expected["predictions"])
    assert got.labels() == ["7", "3"]
    with_logits = client.predict("lenet", DIGIT_7, include_logits=True)
    raw_logits = post(raw, "/predict", model="lenet", inputs=[{"image": b64(DIGIT_7)}], include_logits=True)
    np.testing.assert_array_equal(with_logits.logits(), np.asarray([raw_logits["predictions"][0]["logits"]]))
    with pytest.raises(ValueError, match="include_logits"):
        got.logits()


def test_activations_equal_the_raw_answer(client: Client, raw: httpx.Client) -> None:
    layers = ["conv1", "relu", "fc3"]
    expected = post(raw, "/activations", model="lenet", inputs=[{"image": b64(DIGIT_7)}], layers=layers, capture="both")
    got = client.activations("lenet", DIGIT_7, layers, capture="both")
    assert list(got.tensors) == list(expected["activations"])  # the answer's order: conv1, relu, relu#2, ...
    for layer, sides in expected["activations"].items():
        assert set(got.tensors[layer]) == set(sides)
        for side, payload in sides.items():
            np.testing.assert_array_equal(got.tensors[layer][side], array(payload))
    assert matches(got.predictions, expected["predictions"])
    assert got.output("conv1").shape == (1, 6, 28, 28)
    with pytest.raises(KeyError, match="captured"):
        got.output("conv2")


def test_binary_activations_keep_the_answers_layer_order_whatever_the_files_order(raw: httpx.Client) -> None:
    """A safetensors answer re-encoded by the reference library (a cache or a proxy in between) lists its tensors
    sorted by name; the client still gives the layers in the answer's order, the forward's."""
    body = {"model": "lenet", "inputs": [{"image": b64(DIGIT_7)}], "layers": ["conv1", "relu", "fc3"]}
    expected = list(post(raw, "/activations", **body)["activations"])  # conv1, relu, relu#2, ..., fc3
    binary = raw.post("/activations", json={**body, "format": "safetensors"})
    assert binary.status_code == 200, binary.text
    tensors, metadata = read_safetensors(binary.content)
    resaved = safetensors_save(tensors, metadata=metadata)
    file_order = list(dict.fromkeys(key.rpartition(":")[0] for key in read_safetensors(resaved)[0]))
    assert file_order != expected  # the file's order alone would not give the answer's

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=resaved, headers={"content-type": binary.headers["content-type"]})

    http = httpx.Client(base_url="http://hookserve.test", transport=httpx.MockTransport(handler))
    with http, Client("http://hookserve.test", http=http) as client:
        got = client.activations("lenet", DIGIT_7, ["conv1", "relu", "fc3"])
    assert list(got.tensors) == expected
    assert list(got.flat()) == [f"{layer}:output" for layer in expected]


def test_activation_stats_and_image_equal_the_raw_answers(client: Client, raw: httpx.Client) -> None:
    body = {"model": "lenet", "inputs": [{"image": b64(DIGIT_7)}], "layers": ["conv1", "fc1"]}
    expected = post(raw, "/activations", **body, format="stats")
    got = client.activation_stats("lenet", DIGIT_7, ["conv1", "fc1"])
    assert {k: {s: dataclasses.asdict(v) for s, v in sides.items()} for k, sides in got.stats.items()} == expected[
        "activations"
    ]
    png = raw.post("/activations", json=body | {"layers": ["conv1"], "format": "png"})
    image = client.activations_image("lenet", DIGIT_7, "conv1")
    np.testing.assert_array_equal(np.asarray(image), np.asarray(Image.open(io.BytesIO(png.content))))


def test_gradients_equal_the_raw_answer(client: Client, raw: httpx.Client) -> None:
    expected = post(raw, "/gradients", model="lenet", inputs=[{"image": b64(DIGIT_7)}], target=3, layers=["conv2"])
    got = client.gradients("lenet", DIGIT_7, target=3, layers=["conv2"])
    assert (got.targets, got.scores) == (expected["targets"], expected["scores"])
    assert set(got.gradients) == set(expected["gradients"]) == {"conv2", "input"}
    for key, payload in expected["gradients"].items():
        np.testing.assert_array_equal(got.gradients[key], array(payload))


def test_saliency_equals_the_raw_answer(client: Client, raw: httpx.Client) -> None:
    inputs = [{"image": b64(DIGIT_7)}, {"image": b64(DIGIT_3)}]
    expected = post(raw, "/saliency", model="lenet", inputs=inputs, method="integrated_gradients", steps=8)
    got = client.saliency("lenet", [DIGIT_7, DIGIT_3], method="integrated_gradients", steps=8)
    assert (got.model, got.method) == ("lenet", "integrated_gradients")
    for mine, theirs in zip(got.results, expected["results"], strict=True):
        assert (mine.target, mine.label, mine.score, mine.probability) == (
            theirs["target"],
            theirs["label"],
            theirs["score"],
            theirs["probability"],
        )
        assert mine.convergence_delta == theirs["convergence_delta"]
        np.testing.assert_array_equal(mine.attribution, array(theirs["attribution"]))
        np.testing.assert_array_equal(mine.heatmap, array(theirs["heatmap"]))
    png = raw.post("/saliency", json={"model": "lenet", "inputs": inputs[:1], "method": "gradcam", "format": "png"})
    image = client.saliency_image("lenet", DIGIT_7, method="gradcam")
    np.testing.assert_array_equal(np.asarray(image), np.asarray(Image.open(io.BytesIO(png.content))))


def test_interventions_and_sweeps_equal_the_raw_answers(client: Client, raw: httpx.Client) -> None:
    edits = [{"site": "conv2", "op": "patch", "source": "three", "channels": [0, 1, 2, 3]}]
    body = {"model": "lenet", "inputs": [{"image": b64(DIGIT_7)}], "edits": edits, "layers": ["fc3"]}
    expected = post(raw, "/interventions", **body, sources={"three": [{"image": b64(DIGIT_3)}]}, include_logits=True)
    got = client.interventions("lenet", DIGIT_7, edits, sources={"three": DIGIT_3}, layers=["fc3"])
    assert matches(got.clean, expected["clean"])
    assert matches(got.edited, expected["edited"])
    assert matches(got.change, expected["change"])
    assert got.applied == expected["applied"]
    np.testing.assert_allclose(
        got.activations.output("fc3"), array(expected["activations"]["fc3"]["output"]), rtol=1e-6
    )
    sweep = {"model": "lenet", "inputs": [{"image": b64(DIGIT_7)}], "site": "conv2", "channels": [0, 6], "target": 7}
    expected = post(raw, "/interventions/sweep", **sweep)
    ranked = client.sweep("lenet", DIGIT_7, "conv2", channels=(0, 6), target=7)
    assert matches(ranked, expected)
    assert [c.channel for c in ranked.channels] == [c["channel"] for c in expected["channels"]]


def test_introspection_equals_the_raw_answers(client: Client, raw: httpx.Client) -> None:
    assert [dataclasses.asdict(x) for x in client.layers("lenet")] == raw.get("/models/lenet/layers").json()["layers"]
    summary = raw.get("/models/lenet/summary", params={"depth": 1, "input_size": "2,3,32,32"}).json()
    assert matches(client.summary("lenet", input_size=[2, 3, 32, 32], depth=1), summary)
    state = raw.get("/models/lenet/state-dict", params={"stats": "true"}).json()
    assert dataclasses.asdict(client.state_dict("lenet", stats=True)) == state
    plain = client.state_dict("lenet")
    assert matches(plain, raw.get("/models/lenet/state-dict").json())
    assert plain.entries[0].min is None
    npy = raw.get("/models/lenet/state-dict", params={"key": "conv1.weight", "format": "npy"})
    np.testing.assert_array_equal(client.state_dict_tensor("lenet", "conv1.weight"), np.load(io.BytesIO(npy.content)))
    assert dataclasses.asdict(client.optimizer("lenet")) == raw.get("/models/lenet/optimizer").json()


def test_inspect_checkpoint_equals_the_raw_answer(client: Client, raw: httpx.Client) -> None:
    upload = raw.post(
        "/checkpoints/inspect",
        params={"compare_to": "lenet"},
        files={"file": ("lenet_digits.pt", weights_path().read_bytes())},
    ).json()
    for source in (weights_path(), weights_path().read_bytes()):
        got = client.inspect_checkpoint(source, compare_to="lenet")
        assert matches(got, upload)
    on_server = raw.post("/checkpoints/inspect", json={"path": "lenet_digits.pt"}).json()
    assert matches(client.inspect_checkpoint(path="lenet_digits.pt"), on_server)
    with pytest.raises(ValueError, match="exactly one"):
        client.inspect_checkpoint()


def test_load_and_unload_a_model_with_the_admin_token(client: Client, raw: httpx.Client) -> None:
    spec = {"name": "slow2", "source": "python", "architecture": "slow.py:Slow", "input_size": [1, 4, 4]}
    loading = client.load_model(spec)
    assert (loading.name, loading.status) == ("slow2", "loading")
    ready = client.wait_for_model("slow2", timeout=120)
    assert ready.to_json() == raw.get("/models/slow2").json()
    gone = client.unload_model("slow2")
    assert gone.name == "slow2"
    assert raw.get("/models/slow2").status_code == 404


# ---- every wire agrees ----------------------------------------------------------------------


@pytest.mark.parametrize("wire", [Wire.npz, Wire.json])
def test_binary_and_json_wires_agree(live: LiveServer, client: Client, wire: Wire) -> None:
    tensor = np.random.default_rng(0).standard_normal((3, 32, 32)).astype(np.float32)
    inputs: list[Any] = [DIGIT_7, Image.open(DIGIT_3), tensor, torch.from_numpy(tensor).double()]
    with Client(live.base_url, wire=wire) as other:
        for a, b in (
            (
                client.activations("lenet", inputs, ["conv1", "fc*"]),
                other.activations("lenet", inputs, ["conv1", "fc*"]),
            ),
            (client.gradients("lenet", inputs, layers=["conv2"]), other.gradients("lenet", inputs, layers=["conv2"])),
            (client.saliency("lenet", inputs, method="gradcam"), other.saliency("lenet", inputs, method="gradcam")),
        ):
            assert_same(a, b)
        images_only = [DIGIT_7, DIGIT_3.read_bytes()]
        assert_same(client.predict("lenet", images_only, top_k=10), other.predict("lenet", images_only, top_k=10))


def assert_same(a: Any, b: Any) -> None:
    """Equal results, arrays compared exactly (float32 survives JSON unchanged)."""
    left, right = dataclasses.asdict(a), dataclasses.asdict(b)
    np.testing.assert_equal(left, right)


def test_to_torch_shares_the_arrays(client: Client) -> None:
    acts = client.activations("lenet", DIGIT_7, ["conv1"])
    as_torch = acts.to_torch()
    tensor = as_torch.output("conv1")
    assert isinstance(tensor, torch.Tensor)
    assert tensor.dtype == torch.float32
    np.testing.assert_array_equal(tensor.numpy(), acts.output("conv1"))
    tensor.zero_()  # writable, and the same memory
    assert not acts.output("conv1").any()
    grads = client.gradients("lenet", DIGIT_7).to_torch()
    assert isinstance(grads.gradients["input"], torch.Tensor)
    saliency = client.saliency("lenet", DIGIT_7).to_torch()
    assert isinstance(saliency.results[0].heatmap, torch.Tensor)


def test_bfloat16_tensor_inputs_arrive_as_bfloat16(client: Client) -> None:
    x = torch.linspace(-1, 1, 3 * 32 * 32).reshape(3, 32, 32)
    as_bf16 = client.activations("lenet", x.to(torch.bfloat16), ["conv1"], capture="input").input("conv1")
    np.testing.assert_array_equal(as_bf16[0], x.to(torch.bfloat16).float().numpy())


def test_a_slow_call_times_out_per_call(client: Client) -> None:
    from service.client import RequestTimeout

    with pytest.raises(RequestTimeout) as info:
        client.predict("slow", slow_tensor(3.0), timeout=0.3)
    assert info.value.status is None
    assert "within the timeout" in str(info.value)
