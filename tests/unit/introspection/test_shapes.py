"""LayerShapes: per-sample bytes of the probed shapes, scaled to another input size."""

from __future__ import annotations

from service.introspection.shapes import LayerShapes, TensorShape


def test_input_bytes_counts_nothing_for_a_key_without_inputs() -> None:
    shapes = LayerShapes(inputs={"conv": [TensorShape((1, 2, 3, 3), 4)]})
    assert shapes.input_bytes(["conv", "never.ran"]) == 2 * 3 * 3 * 4


def test_a_one_pixel_input_scales_feature_maps_to_one_pixel() -> None:
    probed = LayerShapes(outputs={"conv": [TensorShape((1, 2, 4, 4), 4)]}, probe=(3, 4, 4))
    assert probed.output_bytes() == 2 * 4 * 4 * 4
    assert probed.at((3, 1, 1)).output_bytes() == 2 * 1 * 1 * 4  # an area of 1 over the probe's 16
