"""Class scores into top-k predictions (softmax probabilities, labels)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from service.errors import InvalidField


def require_class_scores(output: Any, model_name: str) -> torch.Tensor:
    """The output must be `[N, K]` class scores; otherwise a 422 that says what it is."""
    if isinstance(output, torch.Tensor) and output.ndim == 2:
        return output
    if isinstance(output, (list, tuple)):
        what = f"a {type(output).__name__} of {len(output)} tensors (feature maps?)"
    elif isinstance(output, torch.Tensor):
        what = f"a tensor of shape {list(output.shape)}"
    else:
        what = type(output).__name__
    raise InvalidField(
        f"model {model_name!r} outputs {what}, not [N, K] class scores; use /activations to read its outputs"
    )


def top_k_predictions(
    logits: torch.Tensor, k: int, label: Callable[[int], str], include_logits: bool
) -> list[dict[str, Any]]:
    """One `{"top_k": [...], "logits"?: [...]}` per row of `logits`."""
    scores = logits.float()
    probs = torch.softmax(scores, dim=1)
    k = min(k, probs.shape[1])
    values, indices = probs.topk(k, dim=1)
    out: list[dict[str, Any]] = []
    for row, (vals, idxs) in enumerate(zip(values.tolist(), indices.tolist(), strict=True)):
        item: dict[str, Any] = {
            "top_k": [{"index": i, "label": label(i), "score": v} for v, i in zip(vals, idxs, strict=True)]
        }
        if include_logits:
            item["logits"] = scores[row].tolist()
        out.append(item)
    return out
