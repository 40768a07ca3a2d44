"""Hook lanes share the served module's weights and nothing of its hooks."""

from __future__ import annotations

import threading
from typing import Any

import torch
from torch import nn

from service.introspection.hooks import count_hooks
from service.registry.lanes import hook_lanes


def net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.LazyLinear(2)).eval()


def test_lanes_share_every_parameter_and_buffer_and_no_module() -> None:
    model = net()
    model(torch.randn(1, 3, 6, 6))  # materialise the lazy layer
    lanes: tuple[Any, ...] = hook_lanes(model, 2)  # Any: Sequentials, indexable
    assert len(lanes) == 2
    for lane in lanes:
        assert all(a is b for a, b in zip(model.parameters(), lane.parameters(), strict=True))
        assert all(a is b for a, b in zip(model.buffers(), lane.buffers(), strict=True))
        served = set(map(id, model.modules()))
        assert not served & set(map(id, lane.modules()))
    assert lanes[0][0] is not lanes[1][0]
    with torch.no_grad():
        next(model.parameters()).add_(1.0)  # a change of the served weights is every lane's
    x = torch.randn(2, 3, 6, 6)
    with torch.inference_mode():
        want = model(x)
        for lane in lanes:
            torch.testing.assert_close(lane(x), want, rtol=0, atol=0)


def test_a_hook_on_a_lane_fires_for_that_lane_only() -> None:
    model = net()
    model(torch.randn(1, 3, 6, 6))
    copies: tuple[Any, ...] = hook_lanes(model, 2)
    lane, other = copies
    fired: list[str] = []
    handle = lane[2].register_forward_hook(lambda *_: fired.append("lane"))
    try:
        assert (count_hooks(lane), count_hooks(model), count_hooks(other)) == (1, 0, 0)
        with torch.inference_mode():
            model(torch.randn(1, 3, 6, 6))
            other(torch.randn(1, 3, 6, 6))
            assert fired == []
            lane(torch.randn(1, 3, 6, 6))
        assert fired == ["lane"]
    finally:
        handle.remove()


class Locked(nn.Module):
    """Holds a lock: deepcopy cannot copy it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.lock = threading.Lock()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with self.lock:
            out: torch.Tensor = self.fc(x)
            return out


def test_a_module_that_cannot_be_copied_has_no_lanes() -> None:
    assert hook_lanes(Locked(), 2) == ()
