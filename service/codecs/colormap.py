"""256-entry RGB lookup tables from matplotlib's perceptually uniform colormaps, built once."""

from __future__ import annotations

from functools import cache

import matplotlib
import numpy as np
from numpy.typing import NDArray

DEFAULT_COLORMAP = "inferno"


@cache
def lut(name: str = DEFAULT_COLORMAP) -> NDArray[np.uint8]:
    """The colormap `name` sampled at 256 evenly spaced points as a read-only `[256, 3]` uint8 array."""
    rgba = matplotlib.colormaps[name](np.linspace(0.0, 1.0, 256))
    table: NDArray[np.uint8] = np.round(np.asarray(rgba, dtype=np.float64)[:, :3] * 255.0).astype(np.uint8)
    table.setflags(write=False)
    return table


def apply(values: NDArray[np.floating], name: str = DEFAULT_COLORMAP) -> NDArray[np.uint8]:
    """Map values in [0, 1] (clipped; NaN as 0) to RGB `[..., 3]` uint8 through the LUT."""
    clean = np.nan_to_num(np.asarray(values, dtype=np.float64), nan=0.0, posinf=1.0, neginf=0.0)
    index = np.round(np.clip(clean, 0.0, 1.0) * 255.0).astype(np.intp)
    return lut(name)[index]


INFERNO = lut(DEFAULT_COLORMAP)
