"""Choosing tokens of a vision transformer's `[N, T, D]` outputs, shared by /activations, /interventions and
/attention; and the token layout an answer reports."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field

TOKEN_WORDS = ("patches", "prefix")


def _one_word(value: Any) -> Any:
    """A multipart field `tokens=patches` arrives as `["patches"]` (form lists are comma-separated)."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str) and not value[0].isdigit():
        return value[0]
    return value


Index = Annotated[int, Field(ge=0)]
TokenChoice = Annotated[
    list[Index] | Literal["patches", "prefix"],
    BeforeValidator(_one_word),
    Field(
        description="Tokens along dim 1 of [N, T, D] outputs: indices in the whole sequence (0 is the class "
        "token of a ViT), `patches` (every patch token) or `prefix` (class, distillation, register tokens).",
        examples=[[0], "patches"],
    ),
]
QueryChoice = Annotated[
    list[Index] | Literal["all", "patches", "prefix"],
    BeforeValidator(_one_word),
    Field(
        description="Query rows: token indices, `all` (the whole [T, T] map), `patches` or `prefix`; "
        "default the class token's row (every row for a model without prefix tokens).",
        examples=[[0], "all"],
    ),
]


class TokenInfo(BaseModel):
    """The tokens of the inputs' size: how many, the prefix tokens' names in order, then the patch grid."""

    count: int = Field(..., examples=[65])
    prefix: list[str] = Field(..., examples=[["cls"]])
    grid: list[int] = Field(..., description="[rows, cols] of patch tokens, row by row after the prefix.")
    patch_size: list[int] = Field(..., description="[height, width] of a patch in input pixels.")
