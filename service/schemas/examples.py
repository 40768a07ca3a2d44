"""Values the OpenAPI examples share, so that Swagger UI's "Try it out" runs each example as pre-filled."""

from __future__ import annotations

from pydantic import JsonValue

# The shipped 8 x 8 grey sample of a handwritten 4 (service/zoo/samples/digit_4.png) as base64: an input every built-in
# model takes (each resizes it to its own input size). tests/unit/schemas/test_examples.py checks it is that file.
SAMPLE_PNG_BASE64 = (
    "iVBORw0KGgoAAAANSUhEUgAAAAgAAAAICAAAAADhZOFXAAAAPUlEQVR4nAXBAQGAIAwAsGmCRyAaEYxABG1AFCIQgQhvcDdYD9Az"
    "gkvs2c5AT3t1nFxVL2ZljQCzghvtS37ZuhVwpKmH2AAAAABJRU5ErkJggg=="
)
SAMPLE_INPUTS: list[JsonValue] = [{"image": SAMPLE_PNG_BASE64}]
