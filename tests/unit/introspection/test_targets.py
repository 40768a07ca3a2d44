"""Target resolution: top-1, index, label, digit string, per-input lists, and the 422s."""

from __future__ import annotations

import pytest
import torch

from service.errors import InvalidField
from service.introspection.targets import class_scores, resolve_targets, target_scores

LOGITS = torch.tensor([[0.1, 2.0, -1.0, 0.5], [3.0, 0.0, 1.0, 4.0], [0.0, 0.0, 9.0, 1.0]])
LABELS = ["cat", "dog", "tiger shark", "great white shark"]


def test_none_is_top1_per_row() -> None:
    assert resolve_targets(None, LOGITS, LABELS) == [1, 3, 2]


def test_int_applies_to_every_row() -> None:
    assert resolve_targets(2, LOGITS, None) == [2, 2, 2]


def test_label_is_looked_up_exactly() -> None:
    assert resolve_targets("great white shark", LOGITS, LABELS) == [3, 3, 3]


def test_digit_string_is_an_index() -> None:
    assert resolve_targets("1", LOGITS, LABELS) == [1, 1, 1]
    assert resolve_targets("0", LOGITS, None) == [0, 0, 0]


def test_a_label_that_is_a_digit_string_wins_over_the_index() -> None:
    labels = ["3", "2", "1", "0"]
    assert resolve_targets("3", LOGITS, labels) == [0, 0, 0]


def test_list_gives_one_target_per_input() -> None:
    assert resolve_targets([0, "tiger shark", "3"], LOGITS, LABELS) == [0, 2, 3]


def test_list_length_must_match_inputs() -> None:
    with pytest.raises(InvalidField, match="2 entries but there are 3 inputs"):
        resolve_targets([0, 1], LOGITS, LABELS)


@pytest.mark.parametrize("bad", [4, -1, 100, "4"])
def test_out_of_range_index_names_the_range(bad: int | str) -> None:
    with pytest.raises(InvalidField, match=r"out of range.*4 classes \[0, 3\]"):
        resolve_targets(bad, LOGITS, LABELS)


def test_unknown_label_lists_closest_labels() -> None:
    with pytest.raises(InvalidField, match="closest labels: 'tiger shark'") as info:
        resolve_targets("tiger shrk", LOGITS, LABELS)
    assert info.value.status == 422


def test_label_without_labels_says_so() -> None:
    with pytest.raises(InvalidField, match="has no labels"):
        resolve_targets("cat", LOGITS, None)


def test_bool_is_not_an_index() -> None:
    with pytest.raises(InvalidField, match="class index or a label"):
        resolve_targets(True, LOGITS, None)


@pytest.mark.parametrize(
    ("output", "what"),
    [
        ([torch.zeros(1, 8, 4, 4), torch.zeros(1, 16, 2, 2)], "list of 2 items"),
        (torch.zeros(1, 8, 4, 4), "4-D float32 tensor of shape \\[1, 8, 4, 4\\]"),
        (torch.zeros(3), "1-D"),
        (torch.zeros(2, 3, dtype=torch.long), "int64"),
        ({"logits": torch.zeros(1, 3)}, "a dict"),
    ],
)
def test_output_that_is_not_class_scores_is_refused(output: object, what: str) -> None:
    with pytest.raises(InvalidField, match=f"output is .*{what}.*not class scores"):
        class_scores(output)
    with pytest.raises(InvalidField, match="not class scores"):
        resolve_targets(None, output, None)  # type: ignore[arg-type]


def test_class_scores_passes_logits_through() -> None:
    assert class_scores(LOGITS) is LOGITS


def test_target_scores_gathers_per_row() -> None:
    assert target_scores(LOGITS, [1, 0, 3]).tolist() == pytest.approx([2.0, 3.0, 1.0])
