"""A model loaded at run time whose state dict holds NaN and Inf: the model card flags exactly those tensors."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from tests.browser.conftest import ADMIN_TOKEN, Watch
from tests.browser.inspector_page import open_inspector
from tests.reliability.live_server import LiveServer

BROKEN = '''\
"""A tiny model with one NaN weight and one Inf bias (what a diverged training run leaves)."""
import torch
from torch import nn


class Broken(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3)
        self.fc = nn.Linear(4, 3)
        with torch.no_grad():
            self.fc.weight[0, 0] = float("nan")
            self.fc.bias[1] = float("inf")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(x).mean(dim=(2, 3)))
'''


@pytest.fixture
def broken(server: LiveServer) -> Iterator[str]:
    (server.model_dir / "broken.py").write_text(BROKEN)
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    spec = {"name": "broken", "source": "python", "architecture": "broken.py:Broken", "input_size": [3, 16, 16]}
    answer = httpx.post(f"{server.base_url}/models", json=spec, headers=headers, timeout=30)
    assert answer.status_code == 202, answer.text
    deadline = time.monotonic() + 60
    while httpx.get(f"{server.base_url}/models/broken", timeout=10).json()["status"] == "loading":
        assert time.monotonic() < deadline, "broken model still loading"
        time.sleep(0.1)
    yield "broken"
    httpx.delete(f"{server.base_url}/models/broken", headers=headers, timeout=30)


def test_nan_and_inf_tensors_are_highlighted(watch: Watch, broken: str) -> None:
    page = watch.page
    open_inspector(page, f"model={broken}")
    page.wait_for_selector("#state-box table")
    flagged = page.eval_on_selector_all("#state-box tr.bad", "rows => rows.map(r => r.dataset.key)")
    assert flagged == ["fc.weight", "fc.bias"]
    assert page.inner_text("#state-box .verdict") == "2 of 4 tensors hold NaN or Inf values."
    assert page.inner_text("#state-box tr[data-key='fc.weight'] td.flag") == "1"
    assert page.inner_text("#state-box tr[data-key='fc.bias'] td.flag") == "1"
    assert page.is_hidden("#card-optimizer")
    watch.screenshot("model-card-nan-inf", element=page.locator("#card-panel"))
