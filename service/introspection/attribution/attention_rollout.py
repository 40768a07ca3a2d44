"""Attention rollout (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers", arXiv:2005.00928).

Each block's heads are fused (mean, max or min) into one `[T, T]` map; optionally its lowest weights are
discarded (the `discard_ratio` of the whole map, the class token's attention to itself kept, as in the
implementation most ViT explanations use); the residual connection is accounted for as `(A + I) / 2`, rows
renormalised to 1; the blocks are multiplied in order, `R = Â_L ⋯ Â_1`. The map is the class token's row
of R over the patch tokens. It does not depend on the target (the answer still reports the target's score).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from service.introspection.attention import forward_with_probabilities
from service.introspection.attribution.base import AttributionContext, Attributions, MethodParams, register_method
from service.introspection.attribution.over_tokens import TokenMapMethod, layout_of, read_out


class HeadFusion(StrEnum):
    mean = "mean"
    max = "max"
    min = "min"


class AttentionRolloutParams(MethodParams):
    method: Literal["attention_rollout"] = "attention_rollout"
    head_fusion: HeadFusion = Field(HeadFusion.mean, description="attention_rollout: how heads become one map.")
    discard_ratio: float = Field(
        0.0, ge=0.0, lt=1.0, description="attention_rollout: the fraction of each block's lowest weights set to 0."
    )


def fuse_heads(maps: Tensor, fusion: HeadFusion) -> Tensor:
    """`[heads, T, T]` into `[T, T]`."""
    if fusion is HeadFusion.max:
        return maps.amax(dim=0)
    if fusion is HeadFusion.min:
        return maps.amin(dim=0)
    return maps.mean(dim=0)


def discard_lowest(fused: Tensor, ratio: float) -> Tensor:
    """`fused` `[T, T]` with its `ratio` lowest weights set to zero, its [0, 0] weight always kept."""
    count = int(fused.numel() * ratio)
    if count == 0:
        return fused
    flat = fused.flatten().clone()
    lowest = flat.topk(count, largest=False).indices
    flat[lowest[lowest != 0]] = 0.0
    return flat.reshape(fused.shape)


def rollout(maps: Sequence[Tensor], fusion: HeadFusion, discard_ratio: float) -> Tensor:
    """R `[T, T]` from one sample's per-block probabilities `[heads, T, T]`, in float64."""
    tokens = int(maps[0].shape[-1])
    eye = torch.eye(tokens, dtype=torch.float64, device=maps[0].device)
    result = eye
    for block in maps:
        fused = discard_lowest(fuse_heads(block.double(), fusion), discard_ratio)
        mixed = (fused + eye) / 2
        result = (mixed / mixed.sum(dim=-1, keepdim=True)) @ result
    return result


@register_method
class AttentionRollout(TokenMapMethod[AttentionRolloutParams]):
    """One forward with every attention module unfused on the lane; each row with its own fusion and ratio, so
    requests of any parameters share a batch. The map is `[rows, cols]` over the patch grid."""

    name = "attention_rollout"
    params = AttentionRolloutParams
    title = "Attention rollout (Abnar & Zuidema 2020): the blocks' head-fused attention multiplied through"

    def attribute(
        self,
        model: nn.Module,
        x: Tensor,
        targets: list[int],
        params: Sequence[AttentionRolloutParams],
        ctx: AttributionContext,
    ) -> Attributions:
        layout = layout_of(model, x, self.name)
        with torch.no_grad():
            _, maps = forward_with_probabilities(model, x.detach())
        rows = []
        for i, own in enumerate(params):
            relevance = rollout([m[i] for m in maps], own.head_fusion, own.discard_ratio)
            rows.append(read_out(relevance, layout).to(x.dtype))
        return Attributions(torch.stack(rows))
