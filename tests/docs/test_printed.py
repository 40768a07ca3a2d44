"""The comparison of printed docs answers with real ones (`tests.helpers.printed`) can fail: each rule, both ways."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.printed import Printed, mismatches, output_mismatches, parse_printed, text_mismatches

PRINTED = '{"a":[...top 5...],"b":{"shape":[1,10],...},"c":[0,1,...],"d":2.62e-6,"e":0.036,"f":"x","g":[{"k":1},...,9]}'
GOOD: dict[str, Any] = {
    "a": [{"anything": 1}],
    "b": {"shape": [1, 10], "more": True},
    "c": [0, 1, 2, 3],
    "d": 2.6222380711260485e-6,
    "e": 0.0364837646484375,
    "f": "x",
    "g": [{"k": 1}, 5, 6, 9],
}


def test_a_matching_answer_has_no_mismatches() -> None:
    assert mismatches(parse_printed(PRINTED), GOOD) == []


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"b": {"shape": [1, 11]}}, "$.b.shape[1]"),
        ({"c": [0, 2, 3]}, "$.c[1]"),
        ({"c": [0]}, "$.c: printed"),
        ({"d": 2.63e-6}, "$.d"),
        ({"e": 0.0366}, "$.e"),
        ({"f": "y"}, "$.f"),
        ({"g": [{"k": 1}, 8]}, "$.g[1]"),
        ({"g": [{"k": 2}, 9]}, "$.g[0].k"),
        ({"extra": 1}, "key 'extra' not printed"),
        ({"b": [1, 10]}, "$.b: printed an object"),
    ],
)
def test_a_different_answer_is_caught(change: dict[str, Any], where: str) -> None:
    problems = mismatches(parse_printed(PRINTED), GOOD | change)
    assert any(where in p for p in problems), problems


def test_a_missing_key_is_caught() -> None:
    answer = dict(GOOD)
    del answer["f"]
    assert mismatches(parse_printed(PRINTED), answer) == ["$: no key 'f'"]


@pytest.mark.parametrize(
    ("text", "close", "far"),
    [
        ("7", 7, 7.5),
        ("0.036", 0.0364, 0.0366),
        ("2.62e-6", 2.6249e-6, 2.626e-6),
        ("0.9999961853027344", 0.99999, 0.9998),
    ],
)
def test_numbers_match_as_rounded(text: str, close: float, far: float) -> None:
    printed = Printed(float(text), text)
    assert printed.matches(close)
    assert not printed.matches(far)
    assert not printed.matches(True)
    assert not printed.matches(str(close))


def test_text_runs_must_appear_in_order() -> None:
    answer = "head\nrow 1\nrow 2\nrow 3\ntotal: 5\n"
    assert text_mismatches("row 1\nrow 2\n...\ntotal: 5\n", answer) == []
    assert text_mismatches("row 1\nrow 3\n", answer)  # not contiguous
    assert text_mismatches("total: 5\n...\nrow 1\n", answer)  # out of order
    assert text_mismatches("total: 6\n", answer)


def test_program_output_numbers_as_rounded_the_rest_exactly() -> None:
    printed = "[[b'0.154703:3:3' b'-0.031698:2:2']] (1, 84)"
    assert output_mismatches(printed, "[[b'0.1547031:3:3' b'-0.031698:2:2']]  (1, 84)\n") == []
    assert output_mismatches(printed, "[[b'0.154803:3:3' b'-0.031698:2:2']] (1, 84)")
    assert output_mismatches(printed, "[[b'0.154703:3:3' b'-0.031698:2:2']] (1, 85)")
    assert output_mismatches(printed, "[[b'0.154703:3:3' b'-0.031698:1:1']] (1, 84)")
    assert output_mismatches(printed, "[[b'0.154703:3:3']] (1, 84)")
