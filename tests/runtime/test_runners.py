"""The runners' small pieces on their own: a request's rows of a batched tensor, and merging a request's layer and
node captures."""

from __future__ import annotations

import pytest
import torch

from service.errors import InvalidField
from service.runtime.runners.activations import CaptureResult, _merged
from service.runtime.runners.base import NotSplittable, rows


def test_rows_are_a_requests_slice_of_the_batch_dimension() -> None:
    t = torch.arange(8.0).reshape(4, 2)
    assert torch.equal(rows(t, (1, 3), 4), t[1:3])


@pytest.mark.parametrize("shape", [[], [3, 2], [5]])
def test_a_tensor_without_the_batch_dimension_is_not_splittable(shape: list[int]) -> None:
    with pytest.raises(NotSplittable, match=r"has no batch dimension of 4"):
        rows(torch.zeros(shape), (0, 1), 4)


def test_a_key_captured_by_both_a_layer_and_a_node_is_that_requests_422_naming_it() -> None:
    t = torch.zeros(1, 2)
    layers = CaptureResult({"a": {"output": t}, "b": {"output": t}}, t)
    nodes = CaptureResult({"b": {"output": t}, "c": {"output": t}}, t)
    merged = _merged(layers, nodes)
    assert isinstance(merged, InvalidField)
    assert str(merged) == "'b': captured by both a layer and a node; ask for it once"


def test_layer_captures_come_before_node_captures() -> None:
    t = torch.zeros(1, 2)
    merged = _merged(CaptureResult({"a": {"output": t}}, t), CaptureResult({"c": {"input": t}}, None))
    assert isinstance(merged, CaptureResult)
    assert list(merged.captured) == ["a", "c"]
    assert merged.output is t
