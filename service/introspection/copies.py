"""Detached NCHW copies of captured tensors, fast for channels_last feature maps.

A capture must copy its tensor when the hook fires (later in-place ops would change it), and
answers are NCHW, so a channels_last (NHWC) feature map is transposed as it is copied. Torch's
one-pass copy walks the whole map with a stride of C elements: once the map outgrows the CPU's
caches it runs ~4 x slower than the same copy made tile by tile (resnet18's conv1 output for
8 images: 41 ms instead of 11). The values are the same bits either way.
"""

from __future__ import annotations

import torch
from torch import Tensor

TILE_BYTES = 1024 * 1024  # one tile of positions x channels: read and written while in cache
SMALL_BYTES = 1024 * 1024  # below this, the one-pass copy is as fast


def detached_copy(t: Tensor) -> Tensor:
    """`t.detach().clone(memory_format=torch.contiguous_format)`, tiled for large channels_last CPU maps."""
    t = t.detach()
    if not _tiles_pay(t):
        return t.clone(memory_format=torch.contiguous_format)
    n, channels, height, width = t.shape
    positions = height * width
    source = t.permute(0, 2, 3, 1).reshape(n, positions, channels)  # a view: NHWC is this in memory
    out = torch.empty((n, channels, positions), dtype=t.dtype)
    tile = max(64, TILE_BYTES // (channels * t.element_size()))
    for i in range(n):
        for start in range(0, positions, tile):
            out[i, :, start : start + tile].copy_(source[i, start : start + tile].t())
    return out.view(n, channels, height, width)


def _tiles_pay(t: Tensor) -> bool:
    return (
        t.device.type == "cpu"
        and t.ndim == 4
        and t.shape[1] > 1
        and t.shape[2] * t.shape[3] > 1
        and not t.is_contiguous()
        and t.is_contiguous(memory_format=torch.channels_last)
        and t.numel() * t.element_size() >= SMALL_BYTES
    )
