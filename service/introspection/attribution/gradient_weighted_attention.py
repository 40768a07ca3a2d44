"""Gradient-weighted attention: Chefer, Gur & Wolf 2021, "Generic Attention-model Explainability for
Interpreting Bi-Modal and Encoder-Decoder Transformers" (ICCV 2021, arXiv:2103.15679), on self-attention.

One forward with the attention probabilities A of every block kept in the graph, one backward from the
target scores to them: each block's map is the heads' mean of the positive part of ∇A ⊙ A, and the
relevance R, starting at the identity, is updated block by block as `R ← R + Ā R`. The map is the class
token's row of R over the patch tokens: unlike rollout, it depends on the target.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor, nn

from service.errors import InvalidField
from service.introspection.attention import forward_with_probabilities
from service.introspection.attribution.base import AttributionContext, Attributions, MethodParams, register_method
from service.introspection.attribution.over_tokens import TokenMapMethod, layout_of, read_out
from service.introspection.targets import class_scores, target_scores


class GradientWeightedAttentionParams(MethodParams):
    method: Literal["gradient_weighted_attention"] = "gradient_weighted_attention"


def relevance(maps: Sequence[Tensor], grads: Sequence[Tensor]) -> Tensor:
    """R `[T, T]` from one sample's per-block probabilities and their gradients `[heads, T, T]`, in float64."""
    tokens = int(maps[0].shape[-1])
    result = torch.eye(tokens, dtype=torch.float64, device=maps[0].device)
    for attention, grad in zip(maps, grads, strict=True):
        weighted = (grad.double() * attention.double()).clamp(min=0).mean(dim=0)
        result = result + weighted @ result
    return result


@register_method
class GradientWeightedAttention(TokenMapMethod[GradientWeightedAttentionParams]):
    """One forward and one backward (to the attention maps only) for the whole batch, each row with its target."""

    name = "gradient_weighted_attention"
    params = GradientWeightedAttentionParams
    title = "Gradient-weighted attention (Chefer et al. 2021): relevance through grad x attention, block by block"

    def attribute(
        self,
        model: nn.Module,
        x: Tensor,
        targets: list[int],
        params: Sequence[GradientWeightedAttentionParams],
        ctx: AttributionContext,
    ) -> Attributions:
        layout = layout_of(model, x, self.name)
        with torch.enable_grad():
            output, maps = forward_with_probabilities(model, x.detach())
            scores = target_scores(class_scores(output), targets)
            if not scores.requires_grad or not maps:
                raise InvalidField(f"{self.name}: the target scores do not depend on the attention maps")
            grads = torch.autograd.grad(scores.sum(), maps, allow_unused=True, materialize_grads=True)
        rows = []
        for i in range(x.shape[0]):
            found = relevance([m[i].detach() for m in maps], [g[i] for g in grads])
            rows.append(read_out(found, layout).to(x.dtype))
        return Attributions(torch.stack(rows))
