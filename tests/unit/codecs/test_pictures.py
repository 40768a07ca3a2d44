"""PNG renderers: feature-map grids and heatmap overlays decode to the expected pixels."""

from __future__ import annotations

import io

import matplotlib
import numpy as np
import pytest
import torch
from numpy.typing import NDArray
from PIL import Image

from service.codecs import colormap
from service.codecs.pictures import (
    SEPARATOR,
    feature_grid_png,
    heatmap_grid_png,
    heatmap_overlay,
    heatmap_overlay_png,
)
from service.errors import InvalidField


def decode(data: bytes) -> tuple[str, NDArray[np.uint8]]:
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    image = Image.open(io.BytesIO(data))
    return image.mode, np.asarray(image)


def test_grid_tiles_are_min_max_scaled_per_channel() -> None:
    ramp = torch.arange(16.0).reshape(4, 4)  # 0..15 row-major
    fmap = torch.stack([ramp, -3 * ramp + 100, torch.full((4, 4), 7.0), torch.zeros(4, 4)])
    mode, pixels = decode(feature_grid_png(fmap, max_channels=8, tile_scale=1))
    assert mode == "L"
    assert pixels.shape == (2 * 4 + SEPARATOR, 2 * 4 + SEPARATOR)  # 4 channels in a 2×2 grid
    first = pixels[:4, :4]
    assert first.tolist() == np.round(np.arange(16).reshape(4, 4) * 17).astype(np.uint8).tolist()
    assert first.min() == 0
    assert first.max() == 255
    second = pixels[:4, 4 + SEPARATOR :]
    assert second.tolist() == (255 - first).tolist()  # reversed ramp
    assert pixels[4 + SEPARATOR :, :4].max() == 0  # flat channel: black
    assert (pixels[4 : 4 + SEPARATOR, :] == 255).all()  # separator row


def test_small_tiles_are_upscaled_nearest_to_about_32px() -> None:
    fmap = torch.rand(10, 7, 7)
    mode, pixels = decode(feature_grid_png(fmap, max_channels=64, tile_scale=None))
    tile = 35  # ceil(32 / 7) = 5, 7 * 5
    cols, rows = 4, 3  # ceil(sqrt(10)) columns
    assert mode == "L"
    assert pixels.shape == (rows * tile + (rows - 1) * SEPARATOR, cols * tile + (cols - 1) * SEPARATOR)
    first = pixels[:tile, :tile]
    assert (first[::5, ::5].repeat(5, 0).repeat(5, 1) == first).all()  # nearest: 5×5 blocks
    assert pixels[-tile:, -tile:].tolist() == np.full((tile, tile), 255).tolist()  # 2 empty cells stay white


def test_max_channels_limits_the_tiles_and_2d_maps_are_one_tile() -> None:
    _, pixels = decode(feature_grid_png(torch.rand(100, 4, 4), max_channels=4, tile_scale=2))
    assert pixels.shape == (2 * 8 + SEPARATOR, 2 * 8 + SEPARATOR)
    _, single = decode(feature_grid_png(torch.rand(5, 6), max_channels=4, tile_scale=1))
    assert single.shape == (5, 6)


def test_non_finite_values_do_not_break_a_tile() -> None:
    channel = torch.tensor([[0.0, 1.0], [float("nan"), float("inf")]])
    _, pixels = decode(feature_grid_png(channel[None], max_channels=1, tile_scale=1))
    assert pixels.tolist() == [[0, 255], [0, 0]]


@pytest.mark.parametrize("shape", [(10,), (1, 2, 3, 4), (0, 3, 3)])
def test_grid_needs_channels_and_spatial_dims(shape: tuple[int, ...]) -> None:
    with pytest.raises(InvalidField, match=r"\[C, h, w\]"):
        feature_grid_png(torch.zeros(shape), max_channels=4, tile_scale=None)


def test_lut_is_matplotlib_inferno() -> None:
    table = colormap.lut("inferno")
    assert table.shape == (256, 3)
    assert table.dtype == np.uint8
    expected = np.round(np.asarray(matplotlib.colormaps["inferno"](np.linspace(0, 1, 256)))[:, :3] * 255)
    assert table.tolist() == expected.astype(np.uint8).tolist()
    assert colormap.lut("inferno") is table  # built once


def test_zero_heatmap_blends_the_first_colour() -> None:
    image = torch.zeros(3, 4, 5)
    image[0] = 1.0  # red
    mode, pixels = decode(heatmap_overlay_png(image, torch.zeros(4, 5), alpha=0.5))
    first = colormap.lut("inferno")[0].astype(np.float64)
    expected = np.round((0.5 * np.array([1.0, 0.0, 0.0]) + 0.5 * first / 255) * 255).astype(np.uint8)
    assert mode == "RGB"
    assert pixels.shape == (4, 5, 3)
    assert (pixels == expected).all()


def test_full_heatmap_at_alpha_one_is_the_last_colour() -> None:
    pixels = heatmap_overlay(torch.rand(3, 2, 2), torch.ones(2, 2), alpha=1.0)
    assert (pixels == colormap.lut("inferno")[255]).all()


def test_grayscale_image_is_repeated_to_rgb() -> None:
    gray = torch.linspace(0, 1, 6).reshape(1, 2, 3)
    pixels = heatmap_overlay(gray, torch.zeros(2, 3), alpha=0.0)
    expected = np.round(gray[0].numpy() * 255).astype(np.uint8)
    for channel in range(3):
        assert pixels[..., channel].tolist() == expected.tolist()


def test_the_png_blends_at_the_alpha_it_is_given() -> None:
    image = torch.rand(3, 4, 5, generator=torch.Generator().manual_seed(1))
    heat = torch.linspace(0, 1, 20).reshape(4, 5)
    _, pixels = decode(heatmap_overlay_png(image, heat, alpha=0.2))
    assert (pixels == heatmap_overlay(image, heat, alpha=0.2)).all()
    assert not (pixels == heatmap_overlay(image, heat, alpha=0.5)).all()


def test_a_two_channel_image_shows_the_mean_of_its_channels_as_gray() -> None:
    two = torch.stack([torch.full((2, 3), 0.2), torch.full((2, 3), 0.6)])
    pixels = heatmap_overlay(two, torch.zeros(2, 3), alpha=0.0)
    assert pixels.shape == (2, 3, 3)
    assert (pixels == round(0.4 * 255)).all()


def test_heatmap_values_below_zero_take_the_first_colour() -> None:
    """Clipped into [0, 1]: a negative value is the colormap's first colour, never one counted from its end."""
    assert (colormap.apply(np.array([-0.5, -1.0])) == colormap.lut("inferno")[0]).all()
    assert (colormap.apply(np.array([1.5])) == colormap.lut("inferno")[255]).all()


def test_overlay_needs_matching_sizes() -> None:
    with pytest.raises(ValueError, match="does not match"):
        heatmap_overlay(torch.zeros(3, 4, 4), torch.zeros(2, 2))


def test_heatmap_grid_has_one_tile_per_input() -> None:
    n, h, w = 5, 6, 7
    images = torch.zeros(n, 3, h, w)
    heatmaps = torch.stack([torch.full((h, w), i / (n - 1)) for i in range(n)])
    mode, pixels = decode(heatmap_grid_png(images, heatmaps, alpha=1.0))
    cols, rows = 3, 2
    assert mode == "RGB"
    assert pixels.shape == (rows * h + (rows - 1) * SEPARATOR, cols * w + (cols - 1) * SEPARATOR, 3)
    lut = colormap.lut("inferno")
    for i in range(n):
        top, left = (i // cols) * (h + SEPARATOR), (i % cols) * (w + SEPARATOR)
        tile = pixels[top : top + h, left : left + w]
        assert (tile == lut[round(i / (n - 1) * 255)]).all()
    assert (pixels[h + SEPARATOR :, 2 * (w + SEPARATOR) :] == 255).all()  # the sixth cell is empty


def test_up_to_four_inputs_make_one_row() -> None:
    _, pixels = decode(heatmap_grid_png([torch.zeros(1, 3, 3)] * 3, [torch.zeros(3, 3)] * 3))
    assert pixels.shape == (3, 3 * 3 + 2 * SEPARATOR, 3)
