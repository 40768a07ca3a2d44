"""The shipped digits LeNet: exact architecture, a resumable SGD checkpoint, accuracy via the serving path."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from sklearn.datasets import load_digits
from torch import nn

from service.codecs.preprocess import preprocess_image
from service.zoo.lenet import (
    LENET_INPUT_SIZE,
    LeNet,
    labels_path,
    lenet_preprocess_spec,
    load_lenet,
    samples_dir,
    weights_path,
)
from service.zoo.train_lenet import augment, digit_image

EXPECTED_LAYERS: list[tuple[str, type[nn.Module], dict[str, Any]]] = [
    ("conv1", nn.Conv2d, {"in_channels": 3, "out_channels": 6, "kernel_size": (5, 5)}),
    ("pool", nn.MaxPool2d, {"kernel_size": 2, "stride": 2}),
    ("conv2", nn.Conv2d, {"in_channels": 6, "out_channels": 16, "kernel_size": (5, 5)}),
    ("fc1", nn.Linear, {"in_features": 400, "out_features": 120}),
    ("fc2", nn.Linear, {"in_features": 120, "out_features": 84}),
    ("fc3", nn.Linear, {"in_features": 84, "out_features": 10}),
    ("relu", nn.ReLU, {"inplace": False}),
]


@pytest.fixture(scope="module")
def checkpoint() -> dict[str, Any]:
    loaded: dict[str, Any] = torch.load(weights_path(), map_location="cpu", weights_only=True)
    return loaded


@pytest.fixture(scope="module")
def digits() -> Any:
    return load_digits()


@pytest.fixture(scope="module")
def model() -> LeNet:
    return load_lenet()


def _png_roundtrip(image: Image.Image) -> Image.Image:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return Image.open(io.BytesIO(buffer.getvalue()))


def test_layers_are_exactly_the_tutorial_lenet() -> None:
    children = list(LeNet().named_children())
    assert [name for name, _ in children] == [name for name, _, _ in EXPECTED_LAYERS]
    for (name, module), (_, kind, attrs) in zip(children, EXPECTED_LAYERS, strict=True):
        assert type(module) is kind, name
        for attr, value in attrs.items():
            assert getattr(module, attr) == value, f"{name}.{attr}"


def test_forward_runs_shared_relu_four_times_and_pool_twice() -> None:
    net = LeNet()
    calls: dict[str, int] = {"relu": 0, "pool": 0}

    def count(name: str) -> Any:
        def hook(*_: Any) -> None:
            calls[name] += 1

        return hook

    net.relu.register_forward_hook(count("relu"))
    net.pool.register_forward_hook(count("pool"))
    out = net(torch.zeros(2, *LENET_INPUT_SIZE))
    assert out.shape == (2, 10)
    assert calls == {"relu": 4, "pool": 2}


def test_preprocess_spec_turns_an_8x8_digit_into_the_input_size() -> None:
    spec = lenet_preprocess_spec()
    assert (spec.resize, spec.crop, spec.grayscale, str(spec.interpolation)) == (32, 32, True, "bilinear")
    image = digit_image(np.full((8, 8), 16.0))
    tensor = preprocess_image(image, spec, channels=3)
    assert list(tensor.shape) == LENET_INPUT_SIZE
    expected = (1.0 - spec.mean[0]) / spec.std[0]
    assert torch.allclose(tensor, torch.full_like(tensor, expected))


def test_digit_image_is_bright_ink_on_dark_uint8() -> None:
    values = np.array([[0.0, 1.0, 15.9, 16.0]] * 2)
    image = digit_image(values)
    assert image.mode == "L"
    assert np.asarray(image).tolist() == [[0, 16, 254, 255]] * 2


def test_augment_is_seeded_and_keeps_the_background() -> None:
    x = torch.full((3, *LENET_INPUT_SIZE), -1.0)
    x[:, :, 12:20, 12:20] = 2.0
    first = augment(x, torch.Generator().manual_seed(5))
    again = augment(x, torch.Generator().manual_seed(5))
    assert torch.equal(first, again)
    assert not torch.equal(first, x)
    assert torch.allclose(first[:, :, 0, 0], torch.full((3, 3), -1.0))


def test_checkpoint_loads_weights_only_with_metadata(checkpoint: dict[str, Any]) -> None:
    assert checkpoint["arch"] == "LeNet"
    assert checkpoint["dataset"] == "sklearn digits"
    assert isinstance(checkpoint["epoch"], int)
    assert checkpoint["epoch"] >= 1
    assert isinstance(checkpoint["loss"], float)
    assert checkpoint["heldout_accuracy"] >= 0.97
    net = LeNet()
    assert checkpoint["model_state_dict"].keys() == net.state_dict().keys()
    for key, value in net.state_dict().items():
        assert checkpoint["model_state_dict"][key].shape == value.shape, key


def test_checkpoint_holds_sgd_state_with_momentum_buffers(checkpoint: dict[str, Any]) -> None:
    params = list(LeNet().parameters())
    sgd = torch.optim.SGD(params, lr=0.001, momentum=0.9)
    sgd.load_state_dict(checkpoint["optimizer_state_dict"])
    (group,) = sgd.param_groups
    assert group["lr"] == 0.001
    assert group["momentum"] == 0.9
    assert len(sgd.state) == len(params) == 10
    for param in params:
        buffer = sgd.state[param]["momentum_buffer"]
        assert buffer.shape == param.shape
        assert buffer.abs().sum() > 0


def test_heldout_accuracy_through_png_and_preprocess(model: LeNet, digits: Any) -> None:
    spec = lenet_preprocess_spec()
    images = [_png_roundtrip(digit_image(v)) for v in digits.images[1437:]]
    batch = torch.stack([preprocess_image(image, spec, channels=3) for image in images])
    with torch.no_grad():
        predicted = model(batch).argmax(dim=1)
    target = torch.as_tensor(digits.target[1437:])
    assert len(target) == 360
    assert (predicted == target).float().mean().item() >= 0.95


def test_labels_file_is_zero_to_nine() -> None:
    assert labels_path().read_text().splitlines() == [str(d) for d in range(10)]


@pytest.mark.parametrize("label", range(10))
def test_sample_is_first_heldout_digit_and_classified_as_it(model: LeNet, digits: Any, label: int) -> None:
    first = 1437 + int(np.flatnonzero(digits.target[1437:] == label)[0])
    with Image.open(samples_dir() / f"digit_{label}.png") as image:
        assert (image.mode, image.size) == ("L", (8, 8))
        assert np.array_equal(np.asarray(image), np.asarray(digit_image(digits.images[first])))
        tensor = preprocess_image(image, lenet_preprocess_spec(), channels=3)
    with torch.no_grad():
        assert int(model(tensor[None]).argmax()) == label


def test_retraining_writes_under_the_working_directory_not_into_the_package() -> None:
    from service.zoo.lenet import samples_dir, weights_path
    from service.zoo.train_lenet import build_parser

    args = build_parser().parse_args([])
    assert (args.out, args.samples_dir) == (Path("lenet_digits.pt"), Path("lenet_samples"))
    assert not args.out.is_absolute()
    assert args.out.resolve() != weights_path().resolve()
    assert args.samples_dir.resolve() != samples_dir().resolve()
