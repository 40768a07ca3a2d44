"""PNG pictures: feature-map grids (grayscale tiles, as in the classic VGG16 figure) and heatmap overlays."""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from numpy.typing import NDArray
from PIL import Image

from service.codecs import colormap
from service.codecs.preprocess import denormalize
from service.errors import InvalidField
from service.introspection.tokens import TokenLayout, is_token_row, row_grid
from service.specs.model import PreprocessSpec

SEPARATOR = 2  # px between tiles
SEPARATOR_VALUE = 255  # white, so black (low) tiles stay distinct
ROW_MAX = 4  # heatmap grids of up to this many inputs are a single row
MIN_TILE = 32  # small feature maps are upscaled (nearest) to at least this many px

Array = NDArray[np.float64]


def feature_grid_png(
    fmap: torch.Tensor | NDArray[np.generic], max_channels: int = 64, tile_scale: int | None = None
) -> bytes:
    """Grayscale grid of the first `max_channels` channels of `fmap` `[C, h, w]` (or `[h, w]`).

    Each channel is min-max scaled to 0..255 on its own (flat channels are black); tiles are
    upscaled by `tile_scale` (nearest), by default so the longer side reaches ~32 px.
    """
    maps = _array(fmap)
    if maps.ndim == 2:
        maps = maps[None]
    if maps.ndim != 3 or 0 in maps.shape:
        raise InvalidField(
            f"a png grid needs a layer output with channels and spatial dims [C, h, w]; this one is "
            f"{list(maps.shape)} per input: ask for format json, stats or a binary format instead"
        )
    if max_channels < 1:
        raise InvalidField(f"max_channels must be at least 1, got {max_channels}")
    maps = maps[:max_channels]
    channels, h, w = maps.shape
    scale = tile_scale if tile_scale is not None else max(1, math.ceil(MIN_TILE / max(h, w)))
    if scale < 1:
        raise InvalidField(f"tile_scale must be at least 1, got {scale}")
    tiles = [_upscale(_to_uint8(channel), scale) for channel in maps]
    cols = math.ceil(math.sqrt(channels))
    return _encode(_grid(tiles, cols, fill=SEPARATOR_VALUE))


def heatmap_overlay(
    image: torch.Tensor | NDArray[np.generic], heatmap: torch.Tensor | NDArray[np.generic], alpha: float = 0.5
) -> NDArray[np.uint8]:
    """`[H, W, 3]` uint8: `(1 - alpha) * image + alpha * colormap(heatmap)` (grayscale repeated to RGB)."""
    rgb = _rgb(_array(image))
    heat = _array(heatmap)
    if heat.shape != rgb.shape[:2]:
        raise ValueError(f"heatmap {list(heat.shape)} does not match the image's H×W {list(rgb.shape[:2])}")
    if not 0.0 <= alpha <= 1.0:
        raise InvalidField(f"alpha must be in [0, 1], got {alpha}")
    colours = colormap.apply(heat).astype(np.float64) / 255.0
    blended = (1.0 - alpha) * rgb + alpha * colours
    return np.round(np.clip(blended, 0.0, 1.0) * 255.0).astype(np.uint8)


def heatmap_overlay_png(
    image: torch.Tensor | NDArray[np.generic], heatmap: torch.Tensor | NDArray[np.generic], alpha: float = 0.5
) -> bytes:
    """PNG of a heatmap `[H, W]` in [0, 1] blended over an image `[C, H, W]` in [0, 1] (de-normalised)."""
    return _encode(heatmap_overlay(image, heatmap, alpha))


def heatmap_grid_png(
    images: Sequence[torch.Tensor | NDArray[np.generic]] | torch.Tensor,
    heatmaps: Sequence[torch.Tensor | NDArray[np.generic]] | torch.Tensor,
    alpha: float = 0.5,
) -> bytes:
    """Several overlays in input order: one row for up to four, else a near-square grid."""
    if len(images) != len(heatmaps) or len(images) == 0:
        raise ValueError(f"need as many heatmaps as images (at least one), got {len(images)} and {len(heatmaps)}")
    tiles = [heatmap_overlay(image, heat, alpha) for image, heat in zip(images, heatmaps, strict=True)]
    cols = len(tiles) if len(tiles) <= ROW_MAX else math.ceil(math.sqrt(len(tiles)))
    return _encode(_grid(tiles, cols, fill=SEPARATOR_VALUE))


def _array(value: torch.Tensor | NDArray[np.generic]) -> Array:
    """Float64 NumPy copy of a tensor (any device/dtype) or array."""
    if isinstance(value, torch.Tensor):
        return value.detach().to(device="cpu", dtype=torch.float64).numpy()
    return np.asarray(value, dtype=np.float64)


def _to_uint8(channel: Array) -> NDArray[np.uint8]:
    """Min-max scale one map to 0..255 over its finite values; non-finite and flat maps give 0."""
    finite = np.isfinite(channel)
    if not finite.any():
        return np.zeros(channel.shape, dtype=np.uint8)
    low, high = float(channel[finite].min()), float(channel[finite].max())
    if high <= low:
        return np.zeros(channel.shape, dtype=np.uint8)
    scaled = (np.where(finite, channel, low) - low) / (high - low)
    return np.round(np.clip(scaled, 0.0, 1.0) * 255.0).astype(np.uint8)


def _upscale(tile: NDArray[np.uint8], scale: int) -> NDArray[np.uint8]:
    """Nearest-neighbour upscaling by an integer factor along both spatial axes."""
    if scale == 1:
        return tile
    return np.repeat(np.repeat(tile, scale, axis=0), scale, axis=1)


def _rgb(image: Array) -> Array:
    """`[C, H, W]` (or `[H, W]`) in [0, 1] to `[H, W, 3]`: 1 channel repeated, 3+ channels' first three."""
    if image.ndim == 2:
        image = image[None]
    if image.ndim != 3 or image.shape[0] == 0:
        raise ValueError(f"an overlay needs an image [C, H, W], got {list(image.shape)}")
    if image.shape[0] >= 3:
        rgb = image[:3]
    elif image.shape[0] == 1:
        rgb = np.repeat(image, 3, axis=0)
    else:
        rgb = np.repeat(image.mean(axis=0, keepdims=True), 3, axis=0)
    return np.clip(np.nan_to_num(rgb.transpose(1, 2, 0), nan=0.0), 0.0, 1.0)


def _grid(tiles: Sequence[NDArray[np.uint8]], cols: int, fill: int) -> NDArray[np.uint8]:
    """Tiles (same-dtype `[h, w]` or `[h, w, 3]`) row-major in `cols` columns with separators."""
    rows = math.ceil(len(tiles) / cols)
    th = max(t.shape[0] for t in tiles)
    tw = max(t.shape[1] for t in tiles)
    extra = tiles[0].shape[2:]
    height = rows * th + (rows - 1) * SEPARATOR
    width = cols * tw + (cols - 1) * SEPARATOR
    canvas = np.full((height, width, *extra), fill, dtype=np.uint8)
    for i, tile in enumerate(tiles):
        top = (i // cols) * (th + SEPARATOR)
        left = (i % cols) * (tw + SEPARATOR)
        canvas[top : top + tile.shape[0], left : left + tile.shape[1]] = tile
    return canvas


def _encode(pixels: NDArray[np.uint8]) -> bytes:
    """PNG bytes of an `[H, W]` (L) or `[H, W, 3]` (RGB) uint8 array."""
    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(pixels)).save(buffer, format="PNG")  # uint8 2-D: L, 3-D: RGB
    return buffer.getvalue()


def activation_grid_png(
    outputs: Mapping[str, torch.Tensor], layer: str | None, channels: int, tokens: TokenLayout | None = None
) -> bytes:
    """The feature maps of the first input at `layer` (default: the first captured output with channels).

    `outputs` maps capture keys to layer outputs `[N, C, h, w]` (`[N, C]` and `[N, L]` are drawn as
    1×1 or one-row maps); a vision transformer's tokens `[N, T, D]` (with `tokens`, their layout) as D maps
    over the patch grid, the prefix tokens left out.
    """
    if not outputs:
        raise InvalidField("format=png draws layer outputs; capture 'output' or 'both'")
    if layer is None:
        candidates = [k for k, t in outputs.items() if t.ndim >= 3]
        if not candidates:
            raise InvalidField("format=png needs a layer whose output has channels and spatial dims ([N, C, H, W])")
        layer = candidates[0]
    if layer not in outputs:
        raise InvalidField(f"png_layer {layer!r} is not among the captured layers {sorted(outputs)}")
    fmap = outputs[layer][0]
    if tokens is not None and is_token_row(fmap, tokens):
        fmap = row_grid(fmap, tokens)
    if fmap.ndim == 1:
        fmap = fmap[:, None, None]
    elif fmap.ndim == 2:
        fmap = fmap[None]
    elif fmap.ndim > 3:
        raise InvalidField(f"png: {layer!r} output has shape {list(outputs[layer].shape)}; need [N, C, H, W]")
    return feature_grid_png(fmap.float(), channels, None)


MIN_PICTURE_SIDE = 224


def saliency_png(
    inputs: Sequence[torch.Tensor], heatmaps: Sequence[torch.Tensor], preprocess: PreprocessSpec, alpha: float
) -> bytes:
    """Each heatmap blended over its de-normalised input; small inputs (a 32×32 digit) are enlarged to be seen."""
    images = [denormalize(x.float(), preprocess) for x in inputs]
    for image, heatmap in zip(images, heatmaps, strict=True):
        if tuple(heatmap.shape) != tuple(image.shape[-2:]):
            raise InvalidField(
                f"png overlays a map of the input's size {list(image.shape[-2:])}, and these maps are "
                f"{list(heatmap.shape)} (an attribution at a layer without spatial dims); ask for json, "
                "safetensors or npz"
            )
    side = min(images[0].shape[-2:])
    maps = list(heatmaps)
    if side < MIN_PICTURE_SIDE:
        factor = -(-MIN_PICTURE_SIDE // side)
        images = [F.interpolate(x[None], scale_factor=factor, mode="nearest")[0] for x in images]
        maps = [F.interpolate(h[None, None].float(), scale_factor=factor, mode="bilinear")[0, 0] for h in maps]
    if len(images) == 1:
        return heatmap_overlay_png(images[0], maps[0], alpha)
    return heatmap_grid_png(images, maps, alpha)


MIN_GRID_TILE = 128
MAX_ATTENTION_TILES = 256


def attention_png(image: torch.Tensor, maps: torch.Tensor, preprocess: PreprocessSpec, alpha: float) -> bytes:
    """Attention maps `[rows, cols, h, w]` over the patch grid (a row per block, a column per head), each min-max
    scaled and blended over the de-normalised input `[C, H, W]`, enlarged (nearest, patches stay whole) so a
    tile's shorter side is at least `MIN_GRID_TILE` px."""
    rows, cols = int(maps.shape[0]), int(maps.shape[1])
    if rows * cols > MAX_ATTENTION_TILES:
        raise InvalidField(f"png draws at most {MAX_ATTENTION_TILES} maps (blocks x heads); ask for fewer")
    picture = denormalize(image.float(), preprocess)
    side = min(picture.shape[-2:])
    if side < MIN_GRID_TILE:
        picture = F.interpolate(picture[None], scale_factor=-(-MIN_GRID_TILE // side), mode="nearest")[0]
    size = tuple(picture.shape[-2:])
    flat = maps.reshape(rows * cols, 1, *maps.shape[2:]).float()
    low = flat.amin(dim=(2, 3), keepdim=True)
    high = flat.amax(dim=(2, 3), keepdim=True)
    scaled = torch.where(high > low, (flat - low) / (high - low).clamp(min=1e-12), torch.zeros_like(flat))
    enlarged = F.interpolate(scaled, size=size, mode="nearest")[:, 0]
    tiles = [heatmap_overlay(picture, heat, alpha) for heat in enlarged]
    return _encode(_grid(tiles, cols, fill=SEPARATOR_VALUE))


def exemplar_maps_png(inputs: torch.Tensor, maps: torch.Tensor, preprocess: PreprocessSpec, alpha: float) -> bytes:
    """A unit's top samples `[k, C, H, W]`, each with the unit's map `[k, h, w]` over it: one scale for every
    tile (the maps' common min to max), so a brighter tile is a stronger response, enlarged (bilinear) to the
    input and blended over the de-normalised image; small inputs are enlarged (nearest) to be seen."""
    images = [denormalize(x.float(), preprocess) for x in inputs]
    flat = maps.float()
    low, high = float(flat.min()), float(flat.max())
    scaled = (flat - low) / (high - low) if high > low else torch.zeros_like(flat)
    side = min(images[0].shape[-2:])
    factor = -(-MIN_GRID_TILE // side) if side < MIN_GRID_TILE else 1
    tiles = []
    for image, heat in zip(images, scaled, strict=True):
        picture = F.interpolate(image[None], scale_factor=factor, mode="nearest")[0] if factor > 1 else image
        size = tuple(picture.shape[-2:])
        spread = F.interpolate(heat[None, None], size=size, mode="bilinear", align_corners=False)[0, 0]
        tiles.append(heatmap_overlay(picture, spread.clamp(0.0, 1.0), alpha))
    cols = len(tiles) if len(tiles) <= ROW_MAX else math.ceil(math.sqrt(len(tiles)))
    return _encode(_grid(tiles, cols, fill=SEPARATOR_VALUE))
