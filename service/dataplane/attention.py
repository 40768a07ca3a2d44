"""Attention maps: a vision transformer's softmax probabilities, per block, head and query row."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from service.dataplane.base import PlaneBase
from service.dataplane.costs import ADVICE_ATTENTION, attention_cost
from service.errors import InvalidField
from service.introspection.attention import AttentionModules, sites_named
from service.introspection.predictions import top_k_predictions
from service.introspection.tokens import QuerySelection, TokenLayout, query_rows, token_layout
from service.registry.loaded import LoadedModel
from service.runtime.runners.attention import ATTENTION, AttentionRequest, AttentionResult
from service.schemas.attention import AttentionRequest as AttentionBody


@dataclass(frozen=True)
class Attention:
    model: LoadedModel  # preprocessing, for the PNG's overlays
    inputs: torch.Tensor  # the decoded inputs, for the PNG
    tokens: TokenLayout | None
    heads: list[int]
    queries: list[int]
    probabilities: dict[str, torch.Tensor]  # attention module -> [N, heads, queries, T]
    predictions: list[dict[str, Any]] | None


class AttentionMaps(PlaneBase):
    async def attention(self, body: AttentionBody, images: Sequence[bytes] | None) -> Attention:
        """Blocks and heads are checked before decoding, queries once the inputs' token count is known."""
        served = self.ready(body.model)
        model = served.model
        found: AttentionModules = model.attention
        found.require(model.name)
        limit = self.settings.max_layers
        sites = sites_named(found, model.layer_names, body.blocks, limit) if body.blocks else list(found.sites)
        if len(sites) > limit:
            raise InvalidField(
                f"{model.name} has {len(sites)} attention modules, more than the limit of {limit} (max_layers): "
                "name the blocks"
            )
        fewest = min(found.sites[s].heads for s in sites)  # every ViT block has as many heads
        heads = list(dict.fromkeys(body.heads)) if body.heads is not None else None
        if heads is not None and max(heads) >= fewest:
            raise InvalidField(f"heads {[h for h in heads if h >= fewest]} are out of range: the blocks have {fewest}")
        selection: QuerySelection = body.queries

        def layout_of(x: torch.Tensor) -> tuple[TokenLayout | None, list[int] | None]:
            layout = token_layout(model.module, tuple(x.shape[1:]))
            return layout, query_rows(selection, layout, None)

        async def checked_inputs() -> torch.Tensor:
            """The decoded inputs, once their token count admits the query rows (and a picture, for png)."""
            x = await self.decode(body.inputs, images, model)
            layout, _ = layout_of(x)
            if body.format.value == "png" and layout is None:
                raise InvalidField("format=png draws maps over the patch grid, which this model does not have")
            return x

        request = AttentionRequest(tuple(sites), tuple(heads) if heads is not None else None, selection)
        fmt = body.format.value
        chosen = [found.sites[s] for s in sites]
        x, result = await self.run_admitted(
            served,
            ATTENTION,
            checked_inputs(),
            request=request,
            estimate=lambda x, shapes: attention_cost(x, shapes, chosen, heads, layout_of(x)[1], fmt=fmt),
            answer=(fmt, ADVICE_ATTENTION),
            dry_run=body.dry_run,
        )
        found_maps: AttentionResult = result
        layout, rows = layout_of(x)
        count = next(iter(found_maps.probabilities.values())).shape[-1] if found_maps.probabilities else 0
        output = found_maps.output
        predictions = None
        if isinstance(output, torch.Tensor) and output.ndim == 2:
            predictions = top_k_predictions(output, 5, model.label, include_logits=False)
        return Attention(
            model,
            x,
            layout,
            heads if heads is not None else list(range(fewest)),
            rows if rows is not None else list(range(count)),
            found_maps.probabilities,
            predictions,
        )
