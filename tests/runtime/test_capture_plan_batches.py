"""Which batches of /activations start a capture plan: a capture set's own batches do; a batch mixing several
requests' sets (their union, which few batches repeat) uses a plan already there but never starts one."""

from __future__ import annotations

import time

import torch
from torch import nn

from service.registry.capture_plans import CapturePlans, PlanSettings
from service.runtime.runners.activations import ACTIVATIONS, CaptureRequest
from service.specs.vocab import Capture
from tests.helpers.loaded import loaded_model


def settled(plans: CapturePlans) -> dict[str, object]:
    deadline = time.monotonic() + 120
    while plans.info()["building"] and time.monotonic() < deadline:
        time.sleep(0.05)
    return plans.info()


def test_only_a_capture_sets_own_batches_start_its_plan() -> None:
    torch.manual_seed(0)
    model = loaded_model(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)), [4])
    plans = CapturePlans(model.module, PlanSettings(limit=4, after=1), name="toy")
    model.capture_plans = plans
    x = torch.randn(2, 4)
    mixed = [CaptureRequest(("0",)), CaptureRequest(("2",))]
    ACTIVATIONS.run(model, [x, x], mixed)
    ACTIVATIONS.run(model, [x, x], mixed)
    assert (plans.info()["building"], plans.info()["plans"], plans.forwards["eager"]) == (0, [], 2)
    ACTIVATIONS.run(model, [x, x], [CaptureRequest(("2", "0")), CaptureRequest(("0", "2"))])  # one set, two orders
    info = settled(plans)
    assert info["plans"] == [{"layers": ["0", "2"], "capture": Capture.output, "sample_shape": [4], "forwards": 0}]
    ACTIVATIONS.run(model, [x, x], mixed)  # the union now has a plan: a mixed batch uses it
    assert plans.forwards["plan"] == 1
