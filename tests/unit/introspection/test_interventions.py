"""apply_edit on tensors made by hand: the selection and each op against plain indexing."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from service.errors import InvalidField
from service.introspection.interventions import EditOp, RowEdits, Selection, apply_edit


def _none(*_: object) -> Tensor:
    raise AssertionError("this edit reads no other run")


def edit(rows: Tensor, op: EditOp) -> Tensor:
    out, _ = apply_edit(rows, op, RowEdits(0, int(rows.shape[0]), [op], _none, _none))
    return out


def test_the_spatial_mean_of_a_sequence_output_averages_its_one_spatial_dim() -> None:
    """[N, C, L] (a Conv1d's output) has one spatial dim: mean replaces each channel by its average over L."""
    rows = torch.arange(2 * 3 * 5, dtype=torch.float32).reshape(2, 3, 5)
    got = edit(rows, EditOp(0, "conv", 1, Selection(channels=(1,)), "mean"))
    want = rows.clone()
    want[:, 1] = rows[:, 1].mean(-1, keepdim=True)
    torch.testing.assert_close(got, want)


def test_a_flat_output_has_no_spatial_dims_to_average() -> None:
    with pytest.raises(InvalidField, match=r"the output \[4\] has no spatial dims to average over"):
        edit(torch.zeros(2, 4), EditOp(0, "fc", 1, Selection(), "mean"))


def test_a_spatial_selection_without_channels_takes_every_channel() -> None:
    rows = torch.ones(2, 3, 4, 5)
    got = edit(rows, EditOp(0, "conv", 1, Selection(y=(1, 3)), "zero"))
    want = rows.clone()
    want[:, :, 1:3, :] = 0
    torch.testing.assert_close(got, want)
    got = edit(rows, EditOp(0, "conv", 1, Selection(x=(4, 5)), "zero"))
    want = rows.clone()
    want[..., 4:5] = 0
    torch.testing.assert_close(got, want)


def test_a_spatial_mean_averages_each_selected_channel_on_its_own() -> None:
    """Several channels of [N, C, H, W]: each becomes its own spatial average, never an average across them."""
    rows = torch.arange(2 * 4 * 3 * 3, dtype=torch.float32).reshape(2, 4, 3, 3)
    got = edit(rows, EditOp(0, "conv", 1, Selection(channels=(0, 2)), "mean"))
    want = rows.clone()
    for c in (0, 2):
        want[:, c] = rows[:, c].mean((-2, -1), keepdim=True)
    torch.testing.assert_close(got, want)
    assert not torch.equal(got[:, 0], got[:, 2])  # two channels, two means
