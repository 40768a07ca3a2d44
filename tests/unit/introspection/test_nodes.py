"""trace_nodes, capture_nodes and run_nodes against torchvision's feature extraction on lenet and resnet18."""

from __future__ import annotations

import copy
import threading
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.models import ResNet, resnet18
from torchvision.models.feature_extraction import create_feature_extractor, get_graph_node_names

from service.errors import InvalidField
from service.introspection.hooks import count_hooks
from service.introspection.nodes import (
    NodeGraph,
    Untraceable,
    capture_nodes,
    node_bytes,
    resolve_nodes,
    run_nodes,
    trace_nodes,
)
from service.zoo.lenet import LeNet, load_lenet
from tests.helpers.compare import assert_batched_close


@pytest.fixture(scope="module")
def lenet() -> LeNet:
    return load_lenet()


@pytest.fixture(scope="module")
def r18() -> ResNet:
    torch.manual_seed(0)
    return resnet18().eval()


def traced(model: nn.Module, size: tuple[int, ...]) -> NodeGraph:
    graph = trace_nodes(model, torch.randn(1, *size, generator=torch.Generator().manual_seed(0)))
    assert isinstance(graph, NodeGraph), graph
    return graph


def out_of_place(model: nn.Module) -> nn.Module:
    """A copy whose in-place activations are not: torchvision's extractor returns tensors that later
    in-place ops have changed (a block's `add` after its `relu_1`), our captures are taken as each node ends."""
    model = copy.deepcopy(model)
    for module in model.modules():
        if hasattr(module, "inplace"):
            setattr(module, "inplace", False)  # noqa: B010  # nn.Module types it as a submodule
    return model


@pytest.mark.parametrize(("name", "size"), [("lenet", (3, 32, 32)), ("r18", (3, 64, 64))])
def test_names_are_torchvisions_and_captures_equal_create_feature_extractor(
    name: str, size: tuple[int, ...], request: pytest.FixtureRequest
) -> None:
    model: nn.Module = request.getfixturevalue(name)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    graph = traced(model, size)
    assert graph.names == get_graph_node_names(model)[1]  # eval-mode names
    assert count_hooks(model) == 0
    assert not any(m.training for m in model.modules())  # never switched to train to trace it
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())

    x = torch.randn(3, *size, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        output, captured, keys = capture_nodes(graph, graph.names, x)
        want = create_feature_extractor(out_of_place(model), graph.names)(x)
        assert torch.equal(output, model(x))
    assert list(captured) == graph.names  # one tensor per node, in graph order
    assert keys == {n: [n] for n in graph.names}
    for node, expected in want.items():
        assert list(captured[node]) == ["output"]
        assert_batched_close(captured[node]["output"], expected, node)


def test_lenet_nodes_name_functional_code_and_reused_modules(lenet: LeNet) -> None:
    graph = traced(lenet, (3, 32, 32))
    assert graph.names == [
        "x",
        "conv1",
        "relu",
        "pool",
        "conv2",
        "relu_1",
        "pool_1",
        "flatten",
        "fc1",
        "relu_2",
        "fc2",
        "relu_3",
        "fc3",
    ]
    info = {i.name: i for i in graph.info}
    assert info["flatten"].op == "call_function"
    assert info["flatten"].target == "torch.flatten"
    assert info["flatten"].module == ""
    assert info["flatten"].module_type == "LeNet"
    assert info["flatten"].shape == [1, 400]
    assert info["relu_1"].target == "relu"
    assert info["relu_1"].module == "relu"
    assert info["relu_1"].inputs == ["conv2"]
    assert info["x"].op == "placeholder"
    assert info["x"].shape == [1, 3, 32, 32]
    assert graph.input_size == (1, 3, 32, 32)


def test_resnet_block_add_is_a_node_of_its_block(r18: ResNet) -> None:
    graph = traced(r18, (3, 64, 64))
    add = next(i for i in graph.info if i.name == "layer1.0.add")
    assert (add.op, add.target, add.module, add.module_type) == (
        "call_function",
        "operator.add",
        "layer1.0",
        "BasicBlock",
    )
    assert add.inputs == ["layer1.0.bn2", "maxpool"]
    assert add.shape == [1, 64, 16, 16]
    assert add.dtype == "float32"


def test_capture_is_taken_before_later_in_place_ops(r18: ResNet) -> None:
    """`layer1.0.add` feeds an in-place ReLU: the capture is the sum, as torchvision's extractor of it alone gives."""
    graph = traced(r18, (3, 64, 64))
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        _, captured, _ = capture_nodes(graph, ["layer1.0.add", "layer1.0.relu_1"], x)
        alone = create_feature_extractor(r18, ["layer1.0.add"])(x)["layer1.0.add"]
    got = captured["layer1.0.add"]["output"]
    assert_batched_close(got, alone, "layer1.0.add")
    assert float(got.min()) < 0  # not yet rectified
    assert torch.equal(captured["layer1.0.relu_1"]["output"], got.clamp(min=0))


def test_run_nodes_reads_and_replaces_in_one_forward(lenet: LeNet) -> None:
    graph = traced(lenet, (3, 32, 32))
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    seen: dict[str, Tensor] = {}

    def edit(name: str, value: Any) -> Any:
        seen[name] = value.clone()
        return torch.zeros_like(value) if name == "relu_2" else value

    with torch.inference_mode():
        out = run_nodes(graph, x, ["flatten", "relu_2"], edit)
        hidden = lenet.fc2(torch.zeros(2, 120))
        want = lenet.fc3(F.relu(hidden))
        flat = torch.flatten(lenet.pool(lenet.relu(lenet.conv2(lenet.pool(lenet.relu(lenet.conv1(x)))))), 1)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-6)
    torch.testing.assert_close(seen["flatten"], flat, rtol=0, atol=1e-6)
    assert count_hooks(lenet) == 0


def test_resolve_nodes_patterns_limits_and_closest(r18: ResNet) -> None:
    graph = traced(r18, (3, 64, 64))
    assert resolve_nodes(graph, ["layer*.1.add", "flatten"], 10) == [
        "layer1.1.add",
        "layer2.1.add",
        "layer3.1.add",
        "layer4.1.add",
        "flatten",
    ]
    with pytest.raises(
        InvalidField, match=r"unknown node 'layer1\.0\.ad'; closest: 'layer1\.0\.add'.*nodes lists them"
    ):
        resolve_nodes(graph, ["layer1.0.ad"], 10)
    with pytest.raises(InvalidField, match=r"'layer1' is a module, not a node: its output is node 'layer1\.1\.relu_1'"):
        resolve_nodes(graph, ["layer1"], 10)  # torchvision's extractor reads a module path as its last node
    with pytest.raises(InvalidField, match=r"pattern 'layer9\.\*' matches no node"):
        resolve_nodes(graph, ["layer9.*"], 10)
    with pytest.raises(InvalidField, match="8 nodes match, more than the limit of 3"):
        resolve_nodes(graph, ["layer*.add"], 3)


class DataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: Tensor) -> Tensor:
        if x.sum() > 0:  # control flow on a value: FX cannot trace it
            return self.fc(x)  # type: ignore[no-any-return]
        return x


class BadGraph(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return x.view(7, -1)  # traces, but fails on the model's own input size


def test_untraceable_models_give_the_first_line_of_the_reason() -> None:
    found = trace_nodes(DataDependent().eval(), torch.randn(1, 4))
    assert isinstance(found, Untraceable)
    assert found.reason == "FX cannot trace it: symbolically traced variables cannot be used as inputs to control flow"
    failing = trace_nodes(BadGraph().eval(), torch.randn(1, 4))
    assert isinstance(failing, Untraceable)
    assert failing.reason.startswith("its traced graph fails on a batch of shape [1, 4]: ")
    assert "shape '[7, -1]' is invalid" in failing.reason  # torch's own first line says why
    assert "\n" not in failing.reason


class Paused(nn.Module):
    """Blocks inside its own trace (while FX's process-wide patch of nn.Module is in place) until released."""

    def __init__(self, entered: threading.Event, release: threading.Event) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.entered = entered
        self.release = release

    def forward(self, x: Tensor) -> Tensor:
        self.entered.set()
        assert self.release.wait(30)
        return self.fc(x)  # type: ignore[no-any-return]


def test_other_threads_forwards_run_untouched_while_a_model_is_traced(lenet: LeNet) -> None:
    entered, release = threading.Event(), threading.Event()
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        want = lenet(x)
    found: list[NodeGraph | Untraceable] = []
    tracing = threading.Thread(target=lambda: found.append(trace_nodes(Paused(entered, release), torch.randn(1, 4))))
    tracing.start()
    try:
        assert entered.wait(30)
        with torch.inference_mode():
            got = lenet(x)  # a served model's forward on another thread, mid-trace
    finally:
        release.set()
        tracing.join(30)
    assert torch.equal(got, want)
    assert isinstance(found[0], NodeGraph)
    assert found[0].names == ["x", "fc"]


def test_node_bytes_are_one_samples_outputs_of_the_named_nodes() -> None:
    """LeNet's flatten gives 16 x 5 x 5 float32s per sample, fc3 10; the batch dim is not counted."""
    graph = trace_nodes(load_lenet(), torch.randn(2, 3, 32, 32))
    assert isinstance(graph, NodeGraph)
    assert node_bytes(graph, ["flatten"]) == 16 * 5 * 5 * 4
    assert node_bytes(graph, ["flatten", "fc3"]) == (400 + 10) * 4
    assert node_bytes(graph, []) == 0
