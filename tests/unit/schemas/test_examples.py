"""The OpenAPI examples' sample image is the shipped digit, so Try it out sends a file every built-in model takes."""

from __future__ import annotations

import base64
from pathlib import Path

from service.schemas.examples import SAMPLE_INPUTS, SAMPLE_PNG_BASE64

SAMPLE = Path(__file__).resolve().parents[3] / "service" / "zoo" / "samples" / "digit_4.png"


def test_the_sample_is_the_shipped_digit() -> None:
    assert base64.b64decode(SAMPLE_PNG_BASE64, validate=True) == SAMPLE.read_bytes()
    assert SAMPLE_INPUTS == [{"image": SAMPLE_PNG_BASE64}]
