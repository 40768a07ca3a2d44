"""Cost estimates against what a request really holds: its decoded inputs, the graph autograd keeps, its answer."""

from __future__ import annotations

import orjson
import pytest
import torch
from torch import nn

from service.api.responses import JSON_OPTIONS
from service.codecs.tensors import json_tensor
from service.dataplane.costs import activations_cost, gradients_cost, predict_cost
from service.introspection.shapes import LayerShapes, probe_shapes
from service.runtime.runners.activations import CaptureRequest


def small_cnn() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 8, 3, padding=1), nn.Flatten(), nn.Linear(512, 5)
    ).eval()


def shapes_of(model: nn.Module) -> LayerShapes:
    return probe_shapes(model, torch.zeros(1, 3, 8, 8), model)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64, torch.uint8])
def test_the_inputs_cost_the_bytes_their_dtype_takes(dtype: torch.dtype) -> None:
    x = torch.ones(2, 3, 8, 8, dtype=dtype)
    held = len(x.numpy().tobytes())  # what the decoded inputs take in memory
    assert predict_cost(x, shapes_of(small_cnn())).cost.parts["inputs"] == held


def test_the_graph_of_layer_gradients_starts_at_the_first_requested_layer_in_forward_order() -> None:
    """Autograd runs from the earliest layer asked for, whatever the order the layers are listed in."""
    shapes = shapes_of(small_cnn())
    x = torch.zeros(2, 3, 8, 8)

    def graph(layers: list[str]) -> int:
        return gradients_cost(x, shapes, layers, False, "json").cost.parts["graph"]

    from_first = graph(["0"])
    assert graph(["4"]) < from_first  # starting later keeps less: the order can show
    assert graph(["4", "0"]) == from_first
    assert graph(["0", "4"]) == from_first
    assert graph(["2", "4"]) == graph(["2"])


def test_a_json_answer_is_costed_at_no_less_than_its_encoded_size() -> None:
    """The estimate of a JSON answer's memory covers the bytes its tensors take once encoded as the server does."""
    model = small_cnn()
    shapes = shapes_of(model)
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    captured: list[torch.Tensor] = []
    handle = model[2].register_forward_hook(lambda m, a, out: captured.append(out.detach().clone()))
    with torch.inference_mode():
        model(x)
    handle.remove()
    encoded = len(orjson.dumps({"2": {"output": json_tensor(captured[0])}}, option=JSON_OPTIONS))
    estimate = activations_cost(x, shapes, CaptureRequest(("2",)), "json")
    assert estimate.answer_numel == captured[0].numel()
    assert estimate.cost.parts["answer"] >= encoded
