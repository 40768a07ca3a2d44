"""Which class score an attribution differentiates: index, label, top-1, or one per input.

Shared by /gradients and /saliency so both read `target` the same way and both refuse
models whose output is not class scores with the same 422.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence

import torch
from torch import Tensor

from service.errors import InvalidField

Target = int | str
TargetSpec = Target | Sequence[Target] | None


def class_scores(output: object) -> Tensor:
    """Return `output` if it is a floating `[N, K]` tensor of class scores, else raise InvalidField."""
    if isinstance(output, Tensor) and output.dim() == 2 and output.is_floating_point():
        return output
    if isinstance(output, Tensor):
        what = f"a {output.dim()}-D {str(output.dtype).removeprefix('torch.')} tensor of shape {list(output.shape)}"
    elif isinstance(output, (list, tuple)):
        what = f"a {type(output).__name__} of {len(output)} items (e.g. feature maps)"
    else:
        what = f"a {type(output).__name__}"
    raise InvalidField(
        f"the model's output is {what}, not class scores of shape [N, K]; "
        "targets, gradients of a class score and saliency need a classifier; "
        "use /activations to look at this model's outputs"
    )


def resolve_targets(target: TargetSpec, logits: Tensor, labels: Sequence[str] | None) -> list[int]:
    """One class index per row of `logits` `[N, K]`.

    None: the row's arg-max. int or str: the same class for every row. A list: one per
    input (its length must be N). A string is a label (exact), else a digit string is an index.
    """
    scores = class_scores(logits)
    n, k = scores.shape
    if target is None:
        return [int(i) for i in scores.detach().argmax(dim=1).tolist()]
    if isinstance(target, (int, str)):
        index = _resolve_one(target, k, labels)
        return [index] * n
    items = list(target)
    if len(items) != n:
        raise InvalidField(
            f"target has {len(items)} entries but there are {n} inputs; give one target per input, "
            "a single class for all, or null for each input's top-1"
        )
    return [_resolve_one(item, k, labels) for item in items]


def check_target(target: TargetSpec, n: int, num_classes: int | None, labels: Sequence[str] | None) -> None:
    """Refuse, before any work, a target that `resolve_targets` would refuse for `n` inputs of any content.

    `num_classes` None (the output's width is unknown until a forward) leaves the check to the forward.
    """
    if target is None or num_classes is None:
        return
    if isinstance(target, (int, str)):
        _resolve_one(target, num_classes, labels)
        return
    items = list(target)
    if len(items) != n:
        raise InvalidField(
            f"target has {len(items)} entries but there are {n} inputs; give one target per input, "
            "a single class for all, or null for each input's top-1"
        )
    for item in items:
        _resolve_one(item, num_classes, labels)


def _resolve_one(target: object, num_classes: int, labels: Sequence[str] | None) -> int:
    """Resolve one class index or label into an index in [0, num_classes)."""
    if isinstance(target, bool) or not isinstance(target, (int, str)):
        raise InvalidField(f"target must be a class index or a label, not {target!r}")
    if isinstance(target, int):
        return _check_index(target, num_classes)
    if labels is not None:
        try:
            return _check_index(list(labels).index(target), num_classes)
        except ValueError:
            pass
    stripped = target.strip()
    if stripped.isdigit():
        return _check_index(int(stripped), num_classes)
    if labels is None:
        raise InvalidField(
            f"unknown target label {target!r}: this model has no labels; give a class index in [0, {num_classes - 1}]"
        )
    close = difflib.get_close_matches(target, list(labels), n=5, cutoff=0.5)
    hint = f"; closest labels: {', '.join(repr(c) for c in close)}" if close else ""
    raise InvalidField(
        f"unknown target label {target!r}{hint}; "
        f"or give a class index in [0, {num_classes - 1}] (GET /models/{{name}} has the labels)"
    )


def _check_index(index: int, num_classes: int) -> int:
    """Refuse an index outside [0, num_classes) (negative indices are not wrapped)."""
    if not 0 <= index < num_classes:
        raise InvalidField(
            f"target index {index} is out of range: the model has {num_classes} classes [0, {num_classes - 1}]"
        )
    return index


def target_scores(logits: Tensor, targets: Sequence[int]) -> Tensor:
    """`logits[i, targets[i]]` for every row, as a 1-D tensor."""
    index = torch.as_tensor(list(targets), dtype=torch.long, device=logits.device)
    return logits.gather(1, index.unsqueeze(1)).squeeze(1)
