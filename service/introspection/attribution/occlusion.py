"""Occlusion (Zeiler & Fergus 2014, arXiv:1311.2901): how much the target score drops when a window of the input
is replaced by a baseline value, slid over the input; Captum's `Occlusion`.

Each input element's attribution is the mean drop over the windows that cover it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Annotated, Literal

import torch
from captum.attr import Occlusion as CaptumOcclusion
from pydantic import Field, model_validator
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

Size = Annotated[int, Field(ge=1, le=1_000_000)]


class OcclusionParams(MethodParams):
    method: Literal["occlusion"] = "occlusion"
    window: list[Size] | None = Field(
        None,
        min_length=1,
        max_length=8,
        description="occlusion: the window over the input's last dims ([h, w]; [c, h, w] to occlude channels "
        "apart); the dims before them are occluded together. Default: an 8th of the input's height and width, "
        "rounded up (28 x 28 on 224 x 224), so a default map is about 15 x 15 window positions at any input size.",
    )
    strides: list[Size] | None = Field(
        None,
        min_length=1,
        max_length=8,
        description="occlusion: the window's step in each of its dims, at most the window (default: half the "
        "window, rounded up, so that windows overlap by half). Window positions per input: limit "
        "max_occlusion_windows.",
    )
    baseline: float = Field(
        0.0,
        ge=-1e6,
        le=1e6,
        allow_inf_nan=False,
        description="occlusion: the value occluded elements take (in the model's input space, after normalisation).",
    )

    @model_validator(mode="after")
    def _strides_match_the_window(self) -> OcclusionParams:
        if self.strides is not None and self.window is None:
            raise ValueError("strides go with a window: give window too")
        if self.strides is not None and self.window is not None and len(self.strides) != len(self.window):
            raise ValueError(f"strides has {len(self.strides)} entries; give one per window dim ({len(self.window)})")
        return self


DEFAULT_FRACTION = 8  # the default window is this fraction of the input's height and width


def default_window(shape: tuple[int, ...]) -> list[int]:
    """The default window over a sample of `shape`: a `DEFAULT_FRACTION`th of its last two dims (the last one for
    a 1-D sample), rounded up; its default strides (half of it) give about 15 positions a dim."""
    return [-(-size // DEFAULT_FRACTION) for size in shape[-2:]]


def sliding(params: OcclusionParams, shape: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """Captum's `sliding_window_shapes` and `strides` over a whole sample of `shape`, and the window positions.

    A 422 when the window has more dims than the input, is larger than it, or steps further than its size.
    """
    window = list(params.window) if params.window is not None else default_window(shape)
    strides = list(params.strides) if params.strides is not None else [-(-w // 2) for w in window]
    if len(window) > len(shape):
        raise InvalidField(f"occlusion: window {window} has more dims than the input {list(shape)}")
    lead = len(shape) - len(window)
    trailing = shape[lead:]
    for dim, (size, w, s) in enumerate(zip(trailing, window, strides, strict=True)):
        if w > size:
            raise InvalidField(f"occlusion: window {window} does not fit in the input's last dims {list(trailing)}")
        if s > w and w != size:
            raise InvalidField(f"occlusion: stride {s} in window dim {dim} is larger than the window ({w})")
    positions = math.prod(-(-(size - w) // s) + 1 for size, w, s in zip(trailing, window, strides, strict=True))
    return tuple(shape[:lead]) + tuple(window), (1,) * lead + tuple(strides), positions


@register_method
class Occlusion(AttributionMethod[OcclusionParams]):
    """Each input runs alone through Captum with its own window, strides and baseline (so requests with different
    parameters share a batch); its occluded copies go through the model the rows per forward at a time (at most
    `perturbation_batch_size`)."""

    name = "occlusion"
    plain_forwards = True
    params = OcclusionParams
    title = "Occlusion (Zeiler & Fergus 2014): the score drop when a sliding window is replaced by a baseline"
    chunked = True
    time_advice = "use a larger window or larger strides"

    def chunk(self, params: OcclusionParams, settings: Settings) -> int:
        return settings.perturbation_batch_size

    def rows_through(self, params: OcclusionParams, shape: tuple[int, ...]) -> tuple[int, int]:
        return sliding(params, shape)[2] + 1, 0  # each window position, and the unoccluded input

    def lighter(self, params: OcclusionParams, shape: tuple[int, ...]) -> tuple[OcclusionParams, str] | None:
        """The window doubled (within the input) with strides of half of it: about a quarter of the positions."""
        window = list(params.window) if params.window is not None else default_window(shape)
        sizes = shape[len(shape) - len(window) :]
        wider = [min(2 * w, size) for w, size in zip(window, sizes, strict=True)]
        if wider == window:
            return None
        strides = [-(-w // 2) for w in wider]
        said = f"window {','.join(map(str, wider))} with strides {','.join(map(str, strides))}"
        return params.model_copy(update={"window": wider, "strides": strides}), said

    def check_input(self, params: OcclusionParams, shape: tuple[int, ...], settings: Settings) -> None:
        positions = sliding(params, shape)[2]
        if positions > settings.max_occlusion_windows:
            raise InvalidField(
                f"occlusion: {positions} window positions per input is over the limit of "
                f"{settings.max_occlusion_windows} (max_occlusion_windows); use a larger window or larger strides"
            )

    def attribute(
        self,
        model: nn.Module,
        x: Tensor,
        targets: list[int],
        params: Sequence[OcclusionParams],
        ctx: AttributionContext,
    ) -> Attributions:
        occlusion = CaptumOcclusion(same_dtype(model, x.dtype))
        rows = []
        for i, (target, own) in enumerate(zip(targets, params, strict=True)):
            window, strides, _ = sliding(own, tuple(x.shape[1:]))
            rows.append(
                occlusion.attribute(
                    x[i : i + 1].detach(),
                    sliding_window_shapes=window,
                    strides=strides,
                    baselines=own.baseline,
                    target=target,
                    perturbations_per_eval=ctx.rows_per_forward(ctx.settings.perturbation_batch_size),
                )
            )
        return Attributions(torch.cat(rows))
