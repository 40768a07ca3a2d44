"""The correction of load-time measurements by what requests took: a bounded moving average, per model."""

from __future__ import annotations

import pytest

from service.dataplane.timing import FACTOR_BOUNDS, MIN_OBSERVED_S, Calibration


def test_calibration_averages_took_over_estimated_per_model() -> None:
    calibration = Calibration()
    assert calibration.factor("a") == 1.0
    calibration.observe("a", 10.0, 5.0)
    assert calibration.factor("a") == pytest.approx(0.5)
    calibration.observe("a", 10.0, 10.0)
    assert calibration.factor("a") == pytest.approx(0.75)
    assert calibration.factor("b") == 1.0


def test_short_requests_teach_nothing_and_factors_are_bounded() -> None:
    calibration = Calibration()
    calibration.observe("a", MIN_OBSERVED_S / 2, 100.0)
    assert calibration.factor("a") == 1.0
    calibration.observe("a", 1.0, 1000.0)
    assert calibration.factor("a") == FACTOR_BOUNDS[1]
