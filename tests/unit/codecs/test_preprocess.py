"""Image preprocessing equals torchvision.transforms.v2 (and timm's eval transform) on the same PIL image."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import timm
import torch
from PIL import Image
from skimage import data as skdata
from timm.data.config import resolve_data_config
from timm.data.transforms_factory import create_transform
from torchvision.transforms import v2

from service.codecs.preprocess import (
    center_crop_box,
    check_preprocessing,
    denormalize,
    preprocess_image,
    preprocessing_steps,
    resized_size,
)
from service.errors import TooLarge
from service.registry.preprocess_defaults import resolve_preprocess
from service.specs.model import Interpolation, ModelSpec, PreprocessSpec

MODES = {
    Interpolation.bilinear: v2.InterpolationMode.BILINEAR,
    Interpolation.bicubic: v2.InterpolationMode.BICUBIC,
    Interpolation.nearest: v2.InterpolationMode.NEAREST,
}


@pytest.fixture(scope="module")
def chelsea() -> Image.Image:
    return Image.fromarray(skdata.chelsea())  # 451 wide, 300 high, RGB


@pytest.fixture(scope="module")
def portrait() -> Image.Image:
    rng = np.random.default_rng(0)
    return Image.fromarray(rng.integers(0, 256, size=(101, 77, 3), dtype=np.uint8))


def reference(spec: PreprocessSpec, *, gray_channels: int | None = None) -> v2.Compose:
    """The torchvision pipeline a client would write from INFO `preprocess`."""
    steps: list[v2.Transform] = []
    if gray_channels is not None:
        steps.append(v2.Grayscale(num_output_channels=gray_channels))
    if spec.resize is not None:
        steps.append(v2.Resize(spec.resize, interpolation=MODES[spec.interpolation], antialias=True))
    if spec.crop is not None:
        steps.append(v2.CenterCrop(spec.crop))
    steps += [v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(spec.mean, spec.std)]
    return v2.Compose(steps)


def test_imagenet_defaults_on_chelsea(chelsea: Image.Image) -> None:
    spec = PreprocessSpec()
    got = preprocess_image(chelsea, spec, 3)
    expected = reference(spec)(chelsea)
    assert got.dtype == torch.float32
    assert got.shape == (3, 224, 224)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("interpolation", list(Interpolation))
@pytest.mark.parametrize(("resize", "crop"), [(50, 45), (64, 64), (40, None), (None, 33)])
def test_interpolations_and_odd_sizes(
    portrait: Image.Image, interpolation: Interpolation, resize: int | None, crop: int | None
) -> None:
    spec = PreprocessSpec(
        resize=resize, crop=crop, interpolation=interpolation, mean=[0.2, 0.3, 0.4], std=[0.5, 0.6, 0.7]
    )
    got = preprocess_image(portrait, spec, 3)
    expected = reference(spec)(portrait)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


def test_crop_larger_than_image_pads_with_black_like_torchvision(portrait: Image.Image) -> None:
    spec = PreprocessSpec(resize=None, crop=120, mean=[0.0], std=[1.0])
    got = preprocess_image(portrait, spec, 3)
    expected = reference(spec)(portrait)
    assert got.shape == (3, 120, 120)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    assert got[:, 0, :].abs().sum() == 0  # top padding row is black


def test_grayscale_is_repeated_to_the_model_channels(chelsea: Image.Image) -> None:
    spec = PreprocessSpec(resize=64, crop=48, grayscale=True)
    got = preprocess_image(chelsea, spec, 3)
    torch.testing.assert_close(got, reference(spec, gray_channels=3)(chelsea), rtol=0, atol=1e-6)


def test_one_channel_model_gets_luminance(chelsea: Image.Image) -> None:
    spec = PreprocessSpec(resize=40, crop=32, mean=[0.5], std=[0.25])
    got = preprocess_image(chelsea, spec, 1)
    assert got.shape == (1, 32, 32)
    torch.testing.assert_close(got, reference(spec, gray_channels=1)(chelsea), rtol=0, atol=1e-6)


def test_single_mean_broadcasts_over_channels(portrait: Image.Image) -> None:
    spec = PreprocessSpec(resize=None, crop=None, mean=[0.5], std=[0.5])
    got = preprocess_image(portrait, spec, 3)
    raw = torch.from_numpy(np.array(portrait)).permute(2, 0, 1).float() / 255
    torch.testing.assert_close(got, (raw - 0.5) / 0.5, rtol=0, atol=1e-6)


def test_rgba_and_palette_images_become_rgb(chelsea: Image.Image) -> None:
    spec = PreprocessSpec(resize=32, crop=32)
    expected = preprocess_image(chelsea, spec, 3)
    torch.testing.assert_close(preprocess_image(chelsea.convert("RGBA"), spec, 3), expected, rtol=0, atol=0)
    palette = chelsea.convert("P")
    torch.testing.assert_close(
        preprocess_image(palette, spec, 3), reference(spec)(palette.convert("RGB")), rtol=0, atol=1e-6
    )


@pytest.mark.parametrize(("name", "kwargs"), [("test_vit", {}), ("efficientvit_b0", {"features_only": True})])
def test_timm_defaults_equal_timms_eval_transform(chelsea: Image.Image, name: str, kwargs: dict[str, Any]) -> None:
    module = timm.create_model(name, **kwargs)
    config = resolve_data_config({}, model=module)  # type: ignore[no-untyped-call]
    spec = ModelSpec.model_validate({"name": "m", "source": "timm", "architecture": name, "kwargs": kwargs})
    preprocess, input_size = resolve_preprocess(spec, module)
    assert input_size == list(config["input_size"])
    assert preprocess.crop == config["input_size"][-1]
    assert preprocess.resize == math.floor(config["input_size"][-1] / config["crop_pct"])
    assert preprocess.interpolation.value == config["interpolation"]
    assert preprocess.mean == pytest.approx(list(config["mean"]))
    assert preprocess.std == pytest.approx(list(config["std"]))
    expected = create_transform(**config)(chelsea)
    torch.testing.assert_close(preprocess_image(chelsea, preprocess, 3), expected, rtol=0, atol=1e-6)


def test_torchvision_defaults_follow_input_size() -> None:
    spec = ModelSpec.model_validate(
        {"name": "m", "source": "python", "architecture": "x:Y", "input_size": [1, 112, 112]}
    )
    preprocess, input_size = resolve_preprocess(spec, torch.nn.Identity())
    assert input_size == [1, 112, 112]
    assert (preprocess.resize, preprocess.crop, preprocess.grayscale) == (128, 112, True)
    plain = ModelSpec.model_validate({"name": "m", "source": "torchvision", "architecture": "resnet18"})
    assert resolve_preprocess(plain, torch.nn.Identity()) == (PreprocessSpec(), [3, 224, 224])


def test_config_preprocess_wins_over_timm() -> None:
    own = PreprocessSpec(resize=10, crop=8, interpolation=Interpolation.nearest, mean=[0.1], std=[0.2])
    spec = ModelSpec.model_validate(
        {"name": "m", "source": "timm", "architecture": "test_vit", "preprocess": own.model_dump()}
    )
    preprocess, input_size = resolve_preprocess(spec, timm.create_model("test_vit"))
    assert preprocess == own
    assert input_size == [3, 160, 160]


@pytest.mark.parametrize(
    ("size", "shorter", "expected"),
    [((451, 300), 256, (384, 256)), ((300, 451), 256, (256, 384)), ((100, 100), 7, (7, 7)), ((77, 101), 50, (50, 65))],
)
def test_resized_size(size: tuple[int, int], shorter: int, expected: tuple[int, int]) -> None:
    assert resized_size(*size, shorter) == expected


@pytest.mark.parametrize(
    ("size", "crop", "box"),
    [((384, 256), 224, (80, 16, 304, 240)), ((50, 65), 45, (2, 10, 47, 55)), ((5, 5), 5, (0, 0, 5, 5))],
)
def test_center_crop_box(size: tuple[int, int], crop: int, box: tuple[int, int, int, int]) -> None:
    assert center_crop_box(*size, crop) == box


def test_denormalize_inverts_normalization(chelsea: Image.Image) -> None:
    spec = PreprocessSpec(resize=32, crop=32)
    raw = reference(PreprocessSpec(resize=32, crop=32, mean=[0.0], std=[1.0]))(chelsea)
    torch.testing.assert_close(denormalize(preprocess_image(chelsea, spec, 3), spec), raw, rtol=0, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_denormalize_keeps_the_inputs_dtype(chelsea: Image.Image, dtype: torch.dtype) -> None:
    spec = PreprocessSpec(resize=32, crop=32)
    x = preprocess_image(chelsea, spec, 3)
    got = denormalize(x.to(dtype), spec)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), denormalize(x, spec), rtol=0, atol=1e-2)


# ---- every step's size, from the header ----------------------------------------------------


@pytest.mark.parametrize(
    ("size", "spec", "made"),
    [
        ((1, 100000), PreprocessSpec(), [(1, 100000), (256, 25600000), (224, 224)]),
        ((640, 480), PreprocessSpec(), [(640, 480), (341, 256), (224, 224)]),
        ((1, 5000), PreprocessSpec(resize=None, crop=32), [(1, 5000), (32, 5000), (32, 32)]),
        ((50, 40), PreprocessSpec(resize=None, crop=None), [(50, 40)]),
    ],
)
def test_preprocessing_steps_are_the_sizes_preprocess_image_makes(
    size: tuple[int, int], spec: PreprocessSpec, made: list[tuple[int, int]]
) -> None:
    assert [(step.width, step.height) for step in preprocessing_steps(*size, spec)] == made
    if size[0] * size[1] <= 5000:  # small enough to run: the last step is the tensor preprocess_image makes
        tensor = preprocess_image(Image.new("RGB", size), spec, 3)
        assert tuple(tensor.shape[1:]) == (made[-1][1], made[-1][0])


def test_a_step_over_the_bound_is_a_413_naming_it_and_the_ratio_that_fits() -> None:
    with pytest.raises(TooLarge) as info:
        check_preprocessing(1, 100000, PreprocessSpec(), 40_000_000, "image[0]")
    detail = str(info.value.detail)
    assert "resizing its shorter side to 256, would make a 256x25600000 image" in detail
    assert "(max_preprocessed_pixels)" in detail
    assert "sides at most 610:1" in detail  # 40,000,000 // 256**2
    check_preprocessing(32 * 610, 32, PreprocessSpec(resize=32, crop=32), 610 * 32 * 32, "image[0]")  # at the bound


def test_padding_to_the_crop_counts_too() -> None:
    with pytest.raises(TooLarge) as info:
        check_preprocessing(1, 5000, PreprocessSpec(resize=None, crop=224), 1_000_000, "image[0]")
    assert "padding it to the 224-pixel crop, would make a 224x5000 image" in str(info.value.detail)
    assert "send a smaller image" in str(info.value.detail)
