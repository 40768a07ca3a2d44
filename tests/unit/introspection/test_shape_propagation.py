"""ShapePropagation: every layer's shapes at another sample shape, on a meta copy of the model, without computing."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from torch import nn
from torchvision.models import resnet18

from service.introspection.shape_propagation import ShapePropagation, ShapesUnknown
from service.introspection.shapes import LayerShapes, probe_shapes
from service.zoo.lenet import LeNet


def probed(model: nn.Module, sample: tuple[int, ...]) -> LayerShapes:
    """The shapes a real forward of one zero sample records."""
    return probe_shapes(model, torch.zeros(1, *sample), model)


def shape_table(shapes: LayerShapes) -> dict[str, Any]:
    return {
        "outputs": {k: [t.shape for t in v] for k, v in shapes.outputs.items()},
        "inputs": {k: [t.shape for t in v] for k, v in shapes.inputs.items()},
        "layers": dict(shapes.layer_of),
    }


@pytest.mark.parametrize("sample", [(3, 1, 300), (3, 300, 1), (3, 45, 70)])
def test_resnet18_at_odd_shapes_has_the_shapes_a_real_forward_has(sample: tuple[int, ...]) -> None:
    model = resnet18().eval()
    propagation = ShapePropagation(model, probed(model, (3, 64, 64)))
    found = propagation.at(sample)
    assert shape_table(found) == shape_table(probed(model, sample))
    assert found.output_bytes() == probed(model, sample).output_bytes()


def test_a_one_pixel_row_holds_far_more_than_its_area_says() -> None:
    """Padded convolutions keep the 1-pixel dimension: exact shapes, not the input size's scaled by area."""
    model = resnet18().eval()
    at_input = probed(model, (3, 224, 224))
    propagation = ShapePropagation(model, at_input)
    sample = (3, 1, 20000)
    exact = propagation.at(sample).output_bytes()
    assert exact == probed(model, sample).output_bytes()
    assert exact > 5 * at_input.at(sample).output_bytes()  # what scaling by area made of it


def test_the_input_size_is_the_load_time_probe_and_nothing_runs_on_the_model() -> None:
    model = resnet18().eval()
    at_input = probed(model, (3, 32, 32))
    seen: list[torch.device] = []
    model.conv1.register_forward_hook(lambda _m, args, _out: seen.append(args[0].device))
    propagation = ShapePropagation(model, at_input)
    assert propagation.at((3, 32, 32)) is at_input
    propagation.at((3, 8, 80))
    assert seen == []  # the served module's hooks neither ran nor were copied
    assert all(p.device.type == "cpu" for p in model.parameters())  # and its weights stay where they were


def test_answers_are_cached_in_a_bounded_lru() -> None:
    model = LeNet().eval()
    propagation = ShapePropagation(model, probed(model, (3, 32, 32)), capacity=2)
    first = propagation.at((3, 33, 33))
    assert propagation.at((3, 33, 33)) is first
    propagation.at((3, 34, 34))
    propagation.at((3, 33, 33))  # the most recent again
    propagation.at((3, 35, 35))  # evicts (3, 34, 34), the least recent
    assert propagation.cached == 2
    assert propagation.at((3, 33, 33)) is first


def test_a_shape_the_model_refuses_is_a_model_error_with_its_message() -> None:
    model = LeNet().eval()
    propagation = ShapePropagation(model, probed(model, (3, 32, 32)))
    with pytest.raises(ShapesUnknown) as info:
        propagation.at((3, 1, 2000))
    assert info.value.model_error
    assert "Kernel size can't be greater than actual input size" in info.value.reason


class DataDependent(nn.Module):
    """Branches on a value: the meta device holds none."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = self.conv(x)
        return y if float(y.sum()) > 0 else -y


def test_a_model_that_reads_values_cannot_be_propagated_and_says_so() -> None:
    model = DataDependent().eval()
    propagation = ShapePropagation(model, probed(model, (3, 8, 8)))
    with pytest.raises(ShapesUnknown) as info:
        propagation.at((3, 4, 4))
    assert not info.value.model_error  # not the input's fault: the data plane may probe for real instead


class Locked(nn.Module):
    """Holds a lock (cannot be deep-copied)."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()
        self.conv = nn.Conv2d(3, 4, 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with self.lock:
            y: torch.Tensor = self.conv(x)
        return y


def test_a_module_that_cannot_be_deep_copied_is_copied_module_by_module() -> None:
    model = Locked().eval()
    propagation = ShapePropagation(model, probed(model, (3, 8, 8)))
    assert shape_table(propagation.at((3, 1, 40))) == shape_table(probed(model, (3, 1, 40)))
    assert model.conv.weight.device.type == "cpu"


@torch.library.custom_op("hookserve_test::cpu_only", mutates_args=())
def cpu_only(x: torch.Tensor) -> torch.Tensor:
    """An op registered for real tensors alone: no meta (fake) kernel."""
    return x.clone()


class NoMetaKernel(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = cpu_only(x)
        return y


def test_an_op_without_a_meta_kernel_is_unknown_not_an_error_of_the_input() -> None:
    model = NoMetaKernel().eval()
    propagation = ShapePropagation(model, probed(model, (3, 8, 8)))
    with pytest.raises(ShapesUnknown) as info:
        propagation.at((3, 4, 4))
    assert not info.value.model_error
