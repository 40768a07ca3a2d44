"""What the attention methods share: a relevance matrix over the tokens read out at the class token's row.

Both attention rollout and gradient-weighted attention end in a `[T, T]` matrix R whose row i says how much
each input token contributes to token i at the last block. The class token's row (the first prefix token:
what a ViT classifies from) over the patch tokens, laid out on the patch grid, is the map; a model without
prefix tokens averages every row (its head pools every token).
"""

from __future__ import annotations

from typing import ClassVar, TypeVar

import torch.nn.functional as F
from torch import Tensor, nn

from service.errors import InvalidField
from service.introspection.attention import attention_modules
from service.introspection.attribution.base import AttributionMethod, MethodParams
from service.introspection.tokens import TokenLayout, token_layout

P = TypeVar("P", bound=MethodParams)


def layout_of(model: nn.Module, x: Tensor, method: str) -> TokenLayout:
    """The inputs' token layout; a 422 for a model without a patch grid."""
    layout = token_layout(model, tuple(x.shape[1:]))
    if layout is None:
        raise InvalidField(f"{method} maps the class token's relevance onto the patch grid, which this model lacks")
    return layout


def read_out(relevance: Tensor, layout: TokenLayout) -> Tensor:
    """The class token's row of `[T, T]` over the patch tokens (the mean row without prefix tokens), `[rows, cols]`."""
    row = relevance[0] if layout.prefix else relevance.mean(dim=0)
    return row[len(layout.prefix) :].reshape(layout.grid)


class TokenMapMethod(AttributionMethod[P]):
    """A method whose map is over the patch grid `[rows, cols]`, upsampled bilinearly to the input for its heatmap."""

    over_tokens: ClassVar[bool] = True

    def check_model(self, params: P, model: nn.Module, name: str) -> None:
        attention_modules(model).require(name)

    def heatmap(self, row: Tensor, x: Tensor) -> Tensor:
        return F.interpolate(row[None, None].float(), size=tuple(x.shape[-2:]), mode="bilinear", align_corners=False)[
            0, 0
        ]
