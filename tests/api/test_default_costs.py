"""Every saliency method with its defaults, and a sweep of every channel of a model's last Conv2d, fits the
default memory limit and the default deadline on every built-in model (lenet, resnet18, efficientvit_b0). The
methods are enumerated from the registry, so a new one is covered too. The check is the dry run's, with every
model's times per row set to a slow machine's (`SLOW`: resnet18 takes 0.06-0.16 s a row on one thread of the
busy 2-core development machine), so it is deterministic and nothing heavy runs here."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.introspection.attribution import registered_methods
from service.introspection.attribution.occlusion import OcclusionParams, default_window, sliding
from service.introspection.layers import last_conv2d
from service.registry.row_times import RowTimes
from tests.conftest import b64, sample_png

MODELS = ("lenet", "resnet18", "efficientvit_b0")
SLOW = RowTimes(forward=0.2, backward=0.2)  # seconds a row


@pytest.fixture(scope="module")
def slow(builtin_client: TestClient) -> Iterator[TestClient]:
    """The built-in models with `SLOW` times per row (the measured ones are put back afterwards)."""
    fleet = builtin_client.app.state.hookserve.fleet  # type: ignore[attr-defined]
    measured = {name: fleet.ready(name).model.row_times for name in MODELS}
    for name in MODELS:
        fleet.ready(name).model.row_times = SLOW
    yield builtin_client
    for name, times in measured.items():
        fleet.ready(name).model.row_times = times


def image_input() -> list[dict[str, Any]]:
    return [{"image": b64(sample_png(7))}]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("method", sorted(registered_methods()))
def test_every_default_is_admitted(slow: TestClient, model: str, method: str) -> None:
    body = {"model": model, "inputs": image_input(), "method": method, "dry_run": True}
    response = slow.post("/saliency", json=body)
    if response.status_code == 422:  # the method does not apply to this model (a layer it needs, a ViT)
        assert "dry_run" not in response.text
        return
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["admitted"] is True, answer["refusal"]
    assert answer["seconds"] <= answer["deadline_s"]


@pytest.mark.parametrize("model", MODELS)
def test_a_sweep_of_every_channel_is_admitted(slow: TestClient, model: str) -> None:
    served = slow.app.state.hookserve.fleet.ready(model).model  # type: ignore[attr-defined]
    site = last_conv2d(served.module)
    assert site is not None
    body = {"model": model, "inputs": image_input(), "site": site, "dry_run": True}
    answer = slow.post("/interventions/sweep", json=body).json()
    assert answer["admitted"] is True, answer["refusal"]


@pytest.mark.parametrize(("size", "window", "positions"), [(224, [28, 28], 15 * 15), (32, [4, 4], 15 * 15)])
def test_the_default_occlusion_window_scales_with_the_input(size: int, window: list[int], positions: int) -> None:
    shape = (3, size, size)
    assert default_window(shape) == window
    assert sliding(OcclusionParams(), shape)[2] == positions
