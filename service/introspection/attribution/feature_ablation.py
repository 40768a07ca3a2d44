"""Feature ablation over groups of input elements, through Captum's `FeatureAblation`: each group in turn is set
to a baseline value and its attribution is the target score's drop.

Groups are superpixels (SLIC: Achanta et al. 2012, "SLIC Superpixels Compared to State-of-the-Art
Superpixel Methods", IEEE TPAMI 34(11)), computed per input with `skimage.segmentation.slic`, or the
cells of a regular grid.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import StrEnum
from typing import Annotated, Literal

import numpy as np
import torch
from captum.attr import FeatureAblation as CaptumFeatureAblation
from pydantic import Field, model_validator
from skimage.segmentation import slic
from torch import Tensor, nn

from service.config import Settings
from service.errors import InvalidField
from service.introspection.attribution.base import (
    AttributionContext,
    AttributionMethod,
    Attributions,
    MethodParams,
    register_method,
    same_dtype,
)


class AblationGroups(StrEnum):
    slic = "slic"
    grid = "grid"


_SLIC_FIELDS = ("segments", "compactness", "sigma")
_GRID_FIELDS = ("cell",)


class FeatureAblationParams(MethodParams):
    method: Literal["feature_ablation"] = "feature_ablation"
    groups: AblationGroups = Field(
        AblationGroups.slic, description="feature_ablation: superpixels of each input (slic) or the cells of a grid."
    )
    segments: int = Field(
        50,
        ge=1,
        description="feature_ablation slic: about how many superpixels (n_segments; limit max_ablation_features).",
    )
    compactness: float = Field(
        1.0,
        gt=0.0,
        le=1000.0,
        description="feature_ablation slic: colour against space; higher gives squarer superpixels.",
    )
    sigma: float = Field(0.0, ge=0.0, le=100.0, description="feature_ablation slic: Gaussian smoothing first (pixels).")
    cell: list[Annotated[int, Field(ge=1, le=1_000_000)]] | None = Field(
        None,
        min_length=1,
        max_length=8,
        description="feature_ablation grid: the cell over the input's last dims ([h, w]); the dims before them "
        "belong to every cell. Cells per input: limit max_ablation_features. Default: a 16th of the input's "
        "height and width, rounded up (14 x 14 on 224 x 224), so about 16 x 16 cells at any input size.",
    )
    baseline: float = Field(
        0.0,
        ge=-1e6,
        le=1e6,
        allow_inf_nan=False,
        description="feature_ablation: the value ablated elements take (in the model's input space).",
    )

    @model_validator(mode="after")
    def _fields_of_the_chosen_groups(self) -> FeatureAblationParams:
        slic = self.groups is AblationGroups.slic
        given = [name for name in (_GRID_FIELDS if slic else _SLIC_FIELDS) if name in self.model_fields_set]
        if given:
            raise ValueError(f"{', '.join(given)} apply to groups={'grid' if slic else 'slic'}")
        return self


GRID_FRACTION = 16  # the default cell is this fraction of the input's height and width


def cell_of(params: FeatureAblationParams, shape: tuple[int, ...]) -> list[int]:
    """The grid's cell: the one asked for, else a `GRID_FRACTION`th of the sample's last two dims, rounded up."""
    if params.cell is not None:
        return list(params.cell)
    return [-(-size // GRID_FRACTION) for size in shape[-2:]]


def grid_cells(cell: Sequence[int], shape: tuple[int, ...]) -> int:
    """How many grid cells cover a sample of `shape` (the last cells may be cut by the border)."""
    return math.prod(-(-size // c) for size, c in zip(shape[len(shape) - len(cell) :], cell, strict=True))


def grid_mask(cell: Sequence[int], shape: tuple[int, ...], device: torch.device) -> Tensor:
    """Captum's feature mask `[1, 1.., *last dims]`: each element's cell number, row-major over the cells."""
    lead = len(shape) - len(cell)
    index = torch.zeros((), dtype=torch.long, device=device)
    for size, c in zip(shape[lead:], cell, strict=True):
        position = torch.arange(size, device=device) // c
        index = index[..., None] * (-(-size // c)) + position
    return index.reshape((1,) + (1,) * lead + tuple(shape[lead:]))


def superpixels(image: Tensor, params: FeatureAblationParams) -> Tensor:
    """Captum's feature mask `[1, 1, H, W]` of SLIC superpixels of one input `[C, H, W]`, numbered 0..n-1.

    SLIC runs on the input as the model sees it (normalised), channels last, without a Lab conversion.
    """
    pixels = image.detach().to(device="cpu", dtype=torch.float64).permute(1, 2, 0).numpy()
    labels = slic(
        pixels,
        n_segments=params.segments,
        compactness=params.compactness,
        sigma=params.sigma,
        channel_axis=-1,
        convert2lab=False,
        start_label=0,
    )
    numbered = np.unique(labels, return_inverse=True)[1].reshape(labels.shape)
    return torch.from_numpy(numbered).to(image.device)[None, None]


@register_method
class FeatureAblation(AttributionMethod[FeatureAblationParams]):
    """Each input runs alone through Captum with its own groups and baseline (so requests with different
    parameters share a batch); ablated copies go through the model the rows per forward at a time (at most
    `perturbation_batch_size`)."""

    name = "feature_ablation"
    plain_forwards = True
    params = FeatureAblationParams
    title = "Feature ablation over superpixels (SLIC, Achanta et al. 2012) or grid cells"
    chunked = True
    time_advice = "use larger cells or fewer segments"

    def chunk(self, params: FeatureAblationParams, settings: Settings) -> int:
        return settings.perturbation_batch_size

    def rows_through(self, params: FeatureAblationParams, shape: tuple[int, ...]) -> tuple[int, int]:
        if params.groups is AblationGroups.slic:
            return params.segments + 1, 0  # about one ablated copy per superpixel, and the input itself
        return grid_cells(cell_of(params, shape), shape) + 1, 0

    def check_limits(self, params: FeatureAblationParams, settings: Settings) -> None:
        if params.groups is AblationGroups.slic and params.segments > settings.max_ablation_features:
            raise InvalidField(
                f"feature_ablation: segments {params.segments} is over the limit of {settings.max_ablation_features} "
                "(max_ablation_features)"
            )

    def check_input(self, params: FeatureAblationParams, shape: tuple[int, ...], settings: Settings) -> None:
        if params.groups is AblationGroups.slic:
            if len(shape) != 3:
                raise InvalidField(
                    f"feature_ablation: slic segments images [C, H, W], and the inputs are {list(shape)}; "
                    "use groups=grid"
                )
            return
        cell = cell_of(params, shape)
        if len(cell) > len(shape):
            raise InvalidField(f"feature_ablation: cell {cell} has more dims than the input {list(shape)}")
        trailing = list(shape[len(shape) - len(cell) :])
        if any(c > size for c, size in zip(cell, trailing, strict=True)):
            raise InvalidField(f"feature_ablation: cell {cell} is larger than the input's last dims {trailing}")
        cells = grid_cells(cell, shape)
        if cells > settings.max_ablation_features:
            raise InvalidField(
                f"feature_ablation: {cells} grid cells per input is over the limit of "
                f"{settings.max_ablation_features} (max_ablation_features); use larger cells"
            )

    def attribute(
        self,
        model: nn.Module,
        x: Tensor,
        targets: list[int],
        params: Sequence[FeatureAblationParams],
        ctx: AttributionContext,
    ) -> Attributions:
        limit = ctx.settings.max_ablation_features
        masks = []
        for i, own in enumerate(params):  # every mask first: a refusal comes before any forward
            if own.groups is AblationGroups.grid:
                masks.append(grid_mask(cell_of(own, tuple(x.shape[1:])), tuple(x.shape[1:]), x.device))
                continue
            if not bool(torch.isfinite(x[i]).all()):
                raise InvalidField(f"feature_ablation: slic segments finite images, and input {i} has NaN or inf")
            mask = superpixels(x[i], own)
            found = int(mask.max()) + 1
            if found > limit:
                raise InvalidField(
                    f"feature_ablation: slic made {found} superpixels of input {i}, over the limit of {limit} "
                    "(max_ablation_features); ask for fewer segments"
                )
            masks.append(mask)
        ablation = CaptumFeatureAblation(same_dtype(model, x.dtype))
        rows = [
            ablation.attribute(
                x[i : i + 1].detach(),
                baselines=own.baseline,
                target=target,
                feature_mask=mask,
                perturbations_per_eval=ctx.rows_per_forward(ctx.settings.perturbation_batch_size),
            )
            for i, (target, own, mask) in enumerate(zip(targets, params, masks, strict=True))
        ]
        return Attributions(torch.cat(rows))
