"""Token sequences of vision transformers: which token is which, choosing tokens, patch tokens as a grid.

A ViT's blocks give `[N, T, D]`: `T` tokens, the prefix tokens first (class, distillation, registers), then
one token per patch, row by row over the patch grid. `token_layout` reads that order from a timm-style
model (`patch_embed`, `num_prefix_tokens`, `cls_token`, `dist_token`, `reg_token`) at an input size; the
rest turns a selection (`[i, ...]`, `"patches"`, `"prefix"`) into indices, and patch tokens into a
`[D, h, w]` map, as pytorch-grad-cam's `reshape_transform` does by hand.

Token indices always count from the start of the whole sequence (0 is the class token of a ViT), also
on tensors that hold the patch tokens alone (`patch_embed`'s output).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from torch import Tensor, nn

from service.errors import InvalidField

TokenSelection = list[int] | Literal["patches", "prefix"]


@dataclass(frozen=True)
class TokenLayout:
    """The tokens of one input size: the prefix tokens' names, the patch grid and the patch size."""

    prefix: tuple[str, ...]
    grid: tuple[int, int]
    patch: tuple[int, int]

    @property
    def patches(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def count(self) -> int:
        return len(self.prefix) + self.patches

    def name(self, index: int) -> str:
        """`cls`, `dist`, `reg0`, ... for prefix tokens; `r<row>c<col>` for a patch token."""
        if index < len(self.prefix):
            return self.prefix[index]
        row, col = divmod(index - len(self.prefix), self.grid[1])
        return f"r{row}c{col}"

    def holds(self, length: int) -> bool:
        """Whether a tensor with `length` tokens along dim 1 is this sequence (or its patch tokens alone)."""
        return length in (self.count, self.patches)

    def describe(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "prefix": list(self.prefix),
            "grid": list(self.grid),
            "patch_size": list(self.patch),
        }


def token_layout(model: nn.Module, sample: Sequence[int]) -> TokenLayout | None:
    """The token layout of a timm-style ViT for inputs of shape `sample` (no batch dim); None for other models."""
    embed = getattr(model, "patch_embed", None)
    prefix = getattr(model, "num_prefix_tokens", None)
    if embed is None or not isinstance(prefix, int) or len(sample) != 3:
        return None
    patch = _pair(getattr(embed, "patch_size", None))
    if patch is None:
        return None
    size = (int(sample[-2]), int(sample[-1]))
    feat = getattr(embed, "dynamic_feat_size", None)
    grid = _pair(feat(size)) if callable(feat) else (size[0] // patch[0], size[1] // patch[1])
    if grid is None or grid[0] < 1 or grid[1] < 1:
        return None
    return TokenLayout(_prefix_names(model, prefix), grid, patch)


def _prefix_names(model: nn.Module, count: int) -> tuple[str, ...]:
    """The class token, then a distillation token (DeiT), then register tokens, as timm concatenates them."""
    names = ["cls"] if getattr(model, "cls_token", None) is not None else []
    if getattr(model, "dist_token", None) is not None:
        names.append("dist")
    registers = getattr(model, "reg_token", None)
    if isinstance(registers, Tensor):
        names += [f"reg{i}" for i in range(int(registers.shape[1]))]
    return tuple(names) if len(names) == count else tuple(f"prefix{i}" for i in range(count))


def _pair(value: object) -> tuple[int, int] | None:
    if isinstance(value, int):
        return value, value
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return int(value[0]), int(value[1])
    return None


def selected_tokens(selection: TokenSelection, layout: TokenLayout) -> list[int]:
    """Indices in the whole sequence; a 422 for an index past its end."""
    if selection == "patches":
        return list(range(len(layout.prefix), layout.count))
    if selection == "prefix":
        if not layout.prefix:
            raise InvalidField("tokens: 'prefix' chooses the prefix tokens, and this model has none")
        return list(range(len(layout.prefix)))
    bad = [i for i in selection if not 0 <= i < layout.count]
    if bad:
        raise InvalidField(
            f"tokens {bad} are out of range: the inputs have {layout.count} tokens "
            f"({_listing(layout)}), indices 0..{layout.count - 1}"
        )
    return list(dict.fromkeys(selection))


def take_tokens(t: Tensor, indices: Sequence[int], layout: TokenLayout, where: str) -> Tensor:
    """`t[:, indices]` for a tensor `[N, T, ...]` of the whole sequence or of its patch tokens alone."""
    length = int(t.shape[1]) if t.ndim >= 3 else -1
    if length == layout.count:
        return t[:, list(indices)]
    if length == layout.patches:
        first = len(layout.prefix)
        if any(i < first for i in indices):
            raise InvalidField(f"{where} holds the patch tokens alone, without the prefix tokens {list(layout.prefix)}")
        return t[:, [i - first for i in indices]]
    raise InvalidField(
        f"{where} gives {list(t.shape[1:])} per input, not a sequence of {layout.count} tokens "
        f"({_listing(layout)}): tokens choose along dim 1 of [N, T, D] outputs"
    )


def patch_grid(t: Tensor, layout: TokenLayout) -> Tensor:
    """The patch tokens of `[N, T, D]` (prefix tokens dropped) as a map `[N, D, rows, cols]`."""
    if t.ndim != 3 or not layout.holds(int(t.shape[1])):
        raise ValueError(f"a token map needs [N, {layout.count}, D], got {list(t.shape)}")
    patches = t[:, t.shape[1] - layout.patches :]
    return patches.transpose(1, 2).reshape(t.shape[0], t.shape[2], *layout.grid)


def is_token_row(row: Tensor, layout: TokenLayout | None) -> bool:
    """Whether one sample's tensor `[T, D]` is a token sequence of `layout`."""
    return layout is not None and row.ndim == 2 and layout.holds(int(row.shape[0]))


def row_grid(row: Tensor, layout: TokenLayout) -> Tensor:
    """One sample's `[T, D]` tokens as `[D, rows, cols]` (prefix tokens dropped)."""
    return patch_grid(row[None], layout)[0]


def _listing(layout: TokenLayout) -> str:
    prefix = f"{', '.join(layout.prefix)} then " if layout.prefix else ""
    return f"{prefix}{layout.grid[0]} x {layout.grid[1]} patches"


def token_names(indices: Sequence[int], layout: TokenLayout) -> list[str]:
    return [layout.name(i) for i in indices]


QuerySelection = TokenSelection | Literal["all"] | None


def query_rows(selection: QuerySelection, layout: TokenLayout | None, count: int | None) -> list[int] | None:
    """The query rows of an attention map `[.., T, T]` a selection names; None for every row. The default
    (None) is the first prefix token's row (a ViT's class token), or every row without prefix tokens."""
    if selection == "all" or (selection is None and (layout is None or not layout.prefix)):
        return None
    if selection is None:
        return [0]
    if layout is None:
        raise InvalidField(
            f"queries: {selection!r} needs the model's token layout (a timm ViT's patch grid), which this model "
            "does not have; ask for 'all'"
        )
    if count is not None and count != layout.count:
        raise InvalidField(f"queries: the attention maps have {count} tokens, the patch grid {layout.count}")
    return selected_tokens(selection, layout)
