"""GET /models/{name}/nodes and node captures in POST /activations, against torchvision's feature extraction."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
import torchvision
from fastapi.testclient import TestClient
from torch import Tensor, nn
from torchvision.models.feature_extraction import create_feature_extractor, get_graph_node_names

from service.zoo.lenet import load_lenet
from tests.conftest import (
    ClientFactory,
    as_tensor,
    assert_served_copies_clean,
    b64,
    digit_pixels,
    direct_capture,
    read_binary_answer,
    sample_png,
    tensor_input,
    write_lenet,
)
from tests.helpers.compare import assert_batched_close, assert_same_predictions

RESNET_SIDE = 64  # resnet18 runs on any side; small inputs keep the references quick


def served(client: TestClient, name: str) -> nn.Module:
    app: Any = client.app
    module: nn.Module = app.state.hookserve.fleet.ready(name).model.module
    return module


def node_graph(client: TestClient, name: str) -> object:
    app: Any = client.app
    graph: object = app.state.hookserve.fleet.ready(name).model.node_graph
    return graph


def assert_no_hooks(client: TestClient, name: str) -> None:
    assert client.get(f"/models/{name}").json()["hooks"] == 0
    assert_served_copies_clean(client.app, name)


@pytest.fixture(scope="module")
def lenet() -> nn.Module:
    return load_lenet()


@pytest.fixture(scope="module")
def resnet(builtin_client: TestClient) -> nn.Module:
    model: nn.Module = torchvision.models.resnet18()
    model.load_state_dict(served(builtin_client, "resnet18").state_dict())
    return model.eval()


def extracted(model: nn.Module, nodes: list[str], x: Tensor) -> dict[str, Tensor]:
    """`create_feature_extractor` on the same nodes, in the server's memory format (channels_last for
    convolutional models), on a copy whose in-place activations are not (see test_in_place_...)."""
    model = copy.deepcopy(model)
    for module in model.modules():
        if hasattr(module, "inplace"):
            setattr(module, "inplace", False)  # noqa: B010  # nn.Module types it as a submodule
    if any(isinstance(m, nn.Conv2d) for m in model.modules()):
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    with torch.inference_mode():
        found: dict[str, Tensor] = create_feature_extractor(model, nodes)(x)
    return found


def post(client: TestClient, **body: Any) -> dict[str, Any]:
    response = client.post("/activations", json=body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def assert_equal_to(got: dict[str, Any], want: dict[str, Tensor]) -> None:
    assert list(got) == list(want)
    for key, expected in want.items():
        assert list(got[key]) == ["output"], key
        assert_batched_close(as_tensor(got[key]["output"]), expected, key)


# ---- GET /models/{name}/nodes -----------------------------------------------------------------


@pytest.mark.parametrize(("name", "reference"), [("lenet", "lenet"), ("resnet18", "resnet")])
def test_nodes_list_torchvisions_names_with_shapes(
    builtin_client: TestClient, name: str, reference: str, request: pytest.FixtureRequest
) -> None:
    model: nn.Module = request.getfixturevalue(reference)
    response = builtin_client.get(f"/models/{name}/nodes")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == name
    size = [1, *builtin_client.get(f"/models/{name}").json()["input_size"]]
    assert body["input_size"] == size
    nodes = body["nodes"]
    assert [n["name"] for n in nodes] == get_graph_node_names(model)[1]
    with torch.inference_mode():
        want = extracted(model, [n["name"] for n in nodes], torch.zeros(size))
    for node in nodes:
        assert node["shape"] == list(want[node["name"]].shape), node
        assert node["dtype"] == "float32"
    assert_no_hooks(builtin_client, name)


def test_resnet_nodes_carry_op_module_and_inputs(builtin_client: TestClient) -> None:
    nodes = {n["name"]: n for n in builtin_client.get("/models/resnet18/nodes").json()["nodes"]}
    assert nodes["layer1.0.add"] == {
        "name": "layer1.0.add",
        "op": "call_function",
        "target": "operator.add",
        "module": "layer1.0",
        "module_type": "BasicBlock",
        "inputs": ["layer1.0.bn2", "maxpool"],
        "shape": [1, 64, 56, 56],
        "dtype": "float32",
    }
    assert nodes["layer1.0.relu_1"]["target"] == "layer1.0.relu"  # the block's ReLU, called a second time
    assert nodes["flatten"]["target"] == "torch.flatten"


def test_nodes_are_traced_once_on_first_request(make_client: ClientFactory, tmp_path: Path) -> None:
    client = make_client(write_lenet(tmp_path))
    assert node_graph(client, "lenet") is None  # nothing traced at load
    first = client.get("/models/lenet/nodes").json()
    graph = node_graph(client, "lenet")
    assert graph is not None
    assert client.get("/models/lenet/nodes").json() == first
    x = digit_pixels(2)
    post(client, model="lenet", inputs=[tensor_input(x)], nodes=["flatten"])
    assert node_graph(client, "lenet") is graph
    assert_no_hooks(client, "lenet")


def test_untraceable_model_is_422_with_the_reason_and_module_capture_still_works(builtin_client: TestClient) -> None:
    response = builtin_client.get("/models/efficientvit_b0/nodes")
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert "symbolically traced variables cannot be used as inputs to control flow" in detail
    assert "\n" not in detail
    assert "layers" in detail  # says what still works
    x = torch.randn(3, 64, 64, generator=torch.Generator().manual_seed(0))
    by_nodes = builtin_client.post(
        "/activations", json={"model": "efficientvit_b0", "inputs": [tensor_input(x)], "nodes": ["x"]}
    )
    assert by_nodes.status_code == 422
    assert by_nodes.json()["detail"] == detail
    body = post(builtin_client, model="efficientvit_b0", inputs=[tensor_input(x)], layers=["stem_res0"])
    assert list(body["activations"]) == ["stem_res0"]
    assert_no_hooks(builtin_client, "efficientvit_b0")


def test_unknown_model_is_404(builtin_client: TestClient) -> None:
    assert builtin_client.get("/models/nope/nodes").status_code == 404


# ---- POST /activations with nodes ---------------------------------------------------------------


def test_lenet_node_captures_equal_create_feature_extractor(builtin_client: TestClient, lenet: nn.Module) -> None:
    x = torch.stack([digit_pixels(d) for d in (1, 8)])
    inputs = [{"image": b64(sample_png(d))} for d in (1, 8)]
    nodes = ["relu_1", "flatten", "relu_3", "fc3"]
    body = post(builtin_client, model="lenet", inputs=inputs, nodes=nodes)
    assert_equal_to(body["activations"], extracted(lenet, nodes, x))
    predicted = builtin_client.post("/predict", json={"model": "lenet", "inputs": inputs, "top_k": 5}).json()
    assert_same_predictions(body["predictions"], predicted["predictions"])
    assert_no_hooks(builtin_client, "lenet")


def test_resnet_node_captures_equal_create_feature_extractor(builtin_client: TestClient, resnet: nn.Module) -> None:
    x = torch.randn(2, 3, RESNET_SIDE, RESNET_SIDE, generator=torch.Generator().manual_seed(1))
    body = post(
        builtin_client, model="resnet18", inputs=[tensor_input(t) for t in x], nodes=["layer*.0.add", "flatten"]
    )
    nodes = ["layer1.0.add", "layer2.0.add", "layer3.0.add", "layer4.0.add", "flatten"]
    assert_equal_to(body["activations"], extracted(resnet, nodes, x))
    assert_no_hooks(builtin_client, "resnet18")


def test_in_place_relu_after_a_node_does_not_change_its_capture(builtin_client: TestClient, resnet: nn.Module) -> None:
    """The served resnet's block ReLU is in place; the add is captured as it ends, as torchvision's extractor
    returns it when nothing runs after it."""
    x = torch.randn(1, 3, RESNET_SIDE, RESNET_SIDE, generator=torch.Generator().manual_seed(2))
    body = post(builtin_client, model="resnet18", inputs=[tensor_input(x[0])], nodes=["layer1.0.add", "fc"])
    got = as_tensor(body["activations"]["layer1.0.add"]["output"])
    with torch.inference_mode():
        alone = create_feature_extractor(resnet, ["layer1.0.add"])(x)["layer1.0.add"]
    assert_batched_close(got, alone, "layer1.0.add")
    assert float(got.min()) < 0


def test_layers_and_nodes_in_one_request(builtin_client: TestClient, lenet: nn.Module) -> None:
    x = digit_pixels(6)[None]
    body = post(
        builtin_client, model="lenet", inputs=[tensor_input(x[0])], layers=["relu"], nodes=["flatten"], capture="both"
    )
    assert list(body["activations"]) == ["relu", "relu#2", "relu#3", "relu#4", "flatten"]  # layers' keys first
    modules = direct_capture(lenet, ["relu"], x, "both")
    for key, sides in modules.items():
        for side, tensor in sides.items():
            assert_batched_close(as_tensor(body["activations"][key][side]), tensor, f"{key}:{side}")
    assert list(body["activations"]["flatten"]) == ["output"]  # nodes give their output
    assert_batched_close(
        as_tensor(body["activations"]["flatten"]["output"]), extracted(lenet, ["flatten"], x)["flatten"]
    )
    assert_no_hooks(builtin_client, "lenet")


@pytest.mark.parametrize("reduce", ["mean", "max", "flatten"])
def test_reduce_applies_to_nodes(builtin_client: TestClient, resnet: nn.Module, reduce: str) -> None:
    x = torch.randn(2, 3, RESNET_SIDE, RESNET_SIDE, generator=torch.Generator().manual_seed(3))
    body = post(
        builtin_client, model="resnet18", inputs=[tensor_input(t) for t in x], nodes=["layer2.1.add"], reduce=reduce
    )
    full = extracted(resnet, ["layer2.1.add"], x)["layer2.1.add"]
    want = {"mean": full.mean(dim=(2, 3)), "max": full.amax(dim=(2, 3)), "flatten": full.flatten(1)}[reduce]
    assert_batched_close(as_tensor(body["activations"]["layer2.1.add"]["output"]), want)


def test_stats_and_binary_formats_key_by_node(builtin_client: TestClient, lenet: nn.Module) -> None:
    x = digit_pixels(3)[None]
    want = extracted(lenet, ["flatten", "relu_2"], x)
    stats = post(
        builtin_client, model="lenet", inputs=[tensor_input(x[0])], nodes=["flatten", "relu_2"], format="stats"
    )
    assert stats["activations"]["flatten"]["output"]["shape"] == [1, 400]
    assert stats["activations"]["relu_2"]["output"]["min"] == pytest.approx(0.0)
    assert stats["activations"]["flatten"]["output"]["mean"] == pytest.approx(float(want["flatten"].mean()), abs=1e-5)
    for fmt in ("safetensors", "npz"):
        response = builtin_client.post(
            "/activations",
            json={"model": "lenet", "inputs": [tensor_input(x[0])], "nodes": ["flatten", "relu_2"], "format": fmt},
        )
        assert response.status_code == 200, response.text
        tensors, rest = read_binary_answer(response.content, fmt)
        assert sorted(tensors) == ["flatten:output", "relu_2:output"]
        assert rest["activations"]["flatten"]["output"]["shape"] == [1, 400]
        assert_batched_close(tensors["flatten:output"], want["flatten"])
    png = builtin_client.post(
        "/activations", json={"model": "lenet", "inputs": [tensor_input(x[0])], "nodes": ["relu"], "format": "png"}
    )
    assert png.status_code == 200
    assert png.headers["content-type"] == "image/png"


def test_multipart_nodes_field_like_curl(builtin_client: TestClient, lenet: nn.Module) -> None:
    response = builtin_client.post(
        "/activations",
        data={"model": "lenet", "nodes": "flatten,relu_3"},
        files=[("image", ("four.png", sample_png(4), "image/png"))],
    )
    assert response.status_code == 200, response.text
    assert_equal_to(response.json()["activations"], extracted(lenet, ["flatten", "relu_3"], digit_pixels(4)[None]))


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"nodes": ["flaten"]}, "unknown node 'flaten'; closest: 'flatten'"),
        ({"nodes": ["conv9*"]}, "pattern 'conv9*' matches no node"),
        ({}, "name at least one layer"),
        ({"nodes": ["flatten"], "capture": "input"}, "capture=input records the inputs of layers"),
        ({"layers": ["conv1"], "nodes": ["conv1"]}, "'conv1': named both as a layer and as a node"),
        (
            {"layers": ["fc*"], "nodes": ["relu*"]},
            "3 layers and 4 nodes, more than the limit of 6 (max_layers) together",
        ),
        ({"nodes": [f"n{i}" for i in range(7)]}, "nodes: 7 names given, more than the limit of 6"),
    ],
)
def test_bad_node_requests_are_422_and_leave_no_hooks(
    make_client: ClientFactory, tmp_path: Path, body: dict[str, Any], says: str
) -> None:
    client = make_client(write_lenet(tmp_path), max_layers=6)
    response = client.post("/activations", json={"model": "lenet", "inputs": [tensor_input(digit_pixels(0))], **body})
    assert response.status_code == 422, response.text
    assert says in str(response.json()["detail"])
    assert_no_hooks(client, "lenet")


def test_a_shape_the_graph_cannot_run_is_422_and_leaves_no_hooks(builtin_client: TestClient) -> None:
    wrong = torch.zeros(3, 20, 20)  # lenet's flatten then fc1 cannot take it
    response = builtin_client.post(
        "/activations", json={"model": "lenet", "inputs": [tensor_input(wrong)], "nodes": ["fc1"]}
    )
    assert response.status_code == 422
    assert "cannot run on samples of shape [3, 20, 20]" in response.json()["detail"]
    assert_no_hooks(builtin_client, "lenet")


def test_too_many_node_names_are_refused_before_any_trace(make_client: ClientFactory, tmp_path: Path) -> None:
    client = make_client(write_lenet(tmp_path), max_layers=6)
    nodes = ["x"] * 7
    response = client.post(
        "/activations", json={"model": "lenet", "inputs": [tensor_input(digit_pixels(0))], "nodes": nodes}
    )
    assert response.status_code == 422
    assert "nodes: 7 names given, more than the limit of 6 (max_layers)" in response.json()["detail"]
    assert node_graph(client, "lenet") is None
