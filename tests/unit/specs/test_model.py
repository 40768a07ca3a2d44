"""The models TOML: API.md's example parses field by field; bad configs are refused with a clear 422."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.errors import InvalidField
from service.specs.model import (
    DType,
    Interpolation,
    ModelSpec,
    PreprocessSpec,
    Source,
    is_url_safe,
    load_specs,
    parse_specs,
)

API_EXAMPLE = """
[[models]]
name = "resnet18"
source = "torchvision"
architecture = "resnet18"
weights = "resnet18.pth"
kwargs = { num_classes = 1000 }
labels = "imagenet.txt"
input_size = [3, 224, 224]
device = "auto"
dtype = "float32"
[models.preprocess]
resize = 256
crop = 224
interpolation = "bilinear"
mean = [0.485, 0.456, 0.406]
std = [0.229, 0.224, 0.225]
grayscale = false
[models.optimizer]
type = "SGD"
lr = 0.001
momentum = 0.9

[[models]]
name = "digits.v2"
source = "python"
architecture = "service.zoo.lenet:LeNet"
dtype = "bfloat16"
"""


def test_api_example_parses_every_field(tmp_path: Path) -> None:
    path = tmp_path / "models.toml"
    path.write_text(API_EXAMPLE)
    first, second = load_specs(path)
    assert first.name == "resnet18"
    assert first.source is Source.torchvision
    assert first.architecture == "resnet18"
    assert first.weights == "resnet18.pth"
    assert first.kwargs == {"num_classes": 1000}
    assert first.labels == "imagenet.txt"
    assert first.input_size == [3, 224, 224]
    assert first.device == "auto"
    assert first.dtype is DType.float32
    assert first.preprocess == PreprocessSpec(
        resize=256,
        crop=224,
        interpolation=Interpolation.bilinear,
        mean=[0.485, 0.456, 0.406],
        std=[0.229, 0.224, 0.225],
        grayscale=False,
    )
    assert first.optimizer is not None
    assert first.optimizer.type == "SGD"
    assert first.optimizer.kwargs() == {"lr": 0.001, "momentum": 0.9}
    # the second entry gets every default
    assert second.source is Source.python
    assert second.dtype is DType.bfloat16
    assert second.weights is None
    assert second.kwargs == {}
    assert second.preprocess is None
    assert second.optimizer is None
    assert second.device is None


def test_preprocess_defaults_are_imagenet() -> None:
    spec = PreprocessSpec()
    assert (spec.resize, spec.crop, spec.interpolation, spec.grayscale) == (256, 224, Interpolation.bilinear, False)
    assert spec.mean == [0.485, 0.456, 0.406]
    assert spec.std == [0.229, 0.224, 0.225]


def test_no_models_key_is_an_empty_registry() -> None:
    assert parse_specs({}) == []


def _one(**fields: object) -> dict[str, object]:
    return {"models": [{"name": "m", "source": "torchvision", "architecture": "resnet18", **fields}]}


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"models": {"name": "m"}}, "array of tables"),
        (_one(name="has space"), "name"),
        (_one(name="../up"), "name"),
        (_one(source="keras"), "source"),
        (_one(dtype="float64"), "dtype"),
        (_one(unknown_key=1), "unknown_key"),
        (_one(input_size=[3, 0, 224]), "input_size"),
        (_one(preprocess={"std": [0.2, 0.0, 0.2]}), "std"),
        (_one(preprocess={"interpolation": "lanczos"}), "interpolation"),
        (_one(preprocess={"resize": 0}), "resize"),
        (_one(preprocess={"shear": 3}), "shear"),
        (_one(architecture=""), "architecture"),
    ],
)
def test_invalid_configs_are_refused(data: dict[str, object], needle: str) -> None:
    with pytest.raises(InvalidField) as info:
        parse_specs(data)
    assert info.value.status == 422
    assert needle in str(info.value.detail)


def test_duplicate_names_are_refused() -> None:
    data = {"models": [_one()["models"][0], _one()["models"][0]]}  # type: ignore[index]
    with pytest.raises(InvalidField, match="duplicate model name 'm'"):
        parse_specs(data)


def test_spec_is_also_the_post_models_body() -> None:
    spec = ModelSpec.model_validate({"name": "x", "source": "timm", "architecture": "test_vit", "weights": "DEFAULT"})
    assert spec.source is Source.timm
    assert spec.weights == "DEFAULT"


@pytest.mark.parametrize(
    ("name", "safe"),
    [("lenet", True), ("resnet18.v2", True), ("a-b_c", True), ("", False), ("-x", False), ("a/b", False), ("é", False)],
)
def test_url_safe_names(name: str, safe: bool) -> None:
    assert is_url_safe(name) is safe
