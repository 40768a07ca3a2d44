"""Requests are costed from the layer shapes at their own sample shape, not the model's input size scaled by area.

A padded stride-2 convolution keeps a 1-pixel dimension at 1 while it halves the other, so an
input `[3, 1, N]` holds several times what scaling the `[3, 32, 32]` shapes by its area says
(resnet18's `[3, 1, 200000]` was estimated at 307 MiB and took 2.35 GiB). Here the estimate of
every capture key and side equals the bytes real captures take, and a request whose real
captures exceed the bound is refused before any forward.
"""

from __future__ import annotations

import base64
import importlib.util
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from fastapi.testclient import TestClient

from tests.conftest import ClientFactory, direct_capture, write_lenet

MIB = 1024 * 1024

STRIDED_PY = '''
import torch
from torch import nn


class Strided(nn.Module):
    """Three padded stride-2 convolutions (one ReLU module called three times)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv1 = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.conv3 = nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.relu = nn.ReLU()
        self.fc = nn.Linear(32, 4)

    def forward(self, x):
        x = self.relu(self.conv1(x))
        x = self.relu(self.conv2(x))
        x = self.relu(self.conv3(x))
        return self.fc(x.mean((2, 3)))
'''

CONFIG = """
[[models]]
name = "strided"
source = "python"
architecture = "strided.py:Strided"
input_size = [3, 32, 32]
"""


def strided_client(make_client: ClientFactory, tmp_path: Path, **settings: Any) -> TestClient:
    (tmp_path / "strided.py").write_text(STRIDED_PY)
    return make_client(CONFIG, **settings)


def strided_module(tmp_path: Path) -> torch.nn.Module:
    """The same architecture, built here: what real captures take does not depend on who runs them."""
    spec = importlib.util.spec_from_file_location("strided_here", tmp_path / "strided.py")
    assert spec is not None
    assert spec.loader is not None
    module = ModuleType("strided_here")
    spec.loader.exec_module(module)
    model: torch.nn.Module = module.Strided().eval()
    return model


def real_capture_bytes(model: torch.nn.Module, shape: tuple[int, ...]) -> int:
    """Bytes of every module's input and output (every call) captured from a real forward of one sample."""
    names = [name for name, _ in model.named_modules() if name]
    captured = direct_capture(model, names, torch.rand(1, *shape), "both")
    return sum(t.numel() * t.element_size() for sides in captured.values() for t in sides.values())


def body(shape: tuple[int, ...], fmt: str) -> dict[str, Any]:
    x = torch.rand(shape, generator=torch.Generator().manual_seed(0))
    tensor = {"shape": list(shape), "dtype": "float32", "b64": base64.b64encode(x.numpy().tobytes()).decode()}
    return {"model": "strided", "inputs": [{"tensor": tensor}], "layers": ["*"], "capture": "both", "format": fmt}


def test_the_estimate_of_every_key_and_side_is_what_real_captures_take(
    make_client: ClientFactory, tmp_path: Path
) -> None:
    """The answer-size check reads the captures' estimated bytes: at odd shapes they equal the real ones."""
    client = strided_client(make_client, tmp_path, max_binary_response_bytes=1)
    model = strided_module(tmp_path)
    for shape in [(3, 1, 100), (3, 100, 1), (3, 7, 45), (3, 32, 32)]:
        response = client.post("/activations", json=body(shape, "safetensors"))
        assert response.status_code == 413, response.text
        found = re.search(r"the binary answer would be (\d+) bytes", response.json()["detail"])
        assert found is not None, response.text
        assert int(found.group(1)) == real_capture_bytes(model, shape), shape


def test_a_one_pixel_wide_tensor_over_the_bound_is_refused(make_client: ClientFactory, tmp_path: Path) -> None:
    """Its real captures alone exceed the bound (scaling the input size's shapes by area made them 2.5 x smaller
    and let it run)."""
    bound = 3 * MIB
    shape = (3, 1, 20000)
    client = strided_client(make_client, tmp_path, max_request_memory_bytes=bound)
    assert real_capture_bytes(strided_module(tmp_path), shape) > bound  # the refusal is right
    response = client.post("/activations", json=body(shape, "stats"))
    assert response.status_code == 413, response.text
    detail = response.json()["detail"]
    assert "max_request_memory_bytes" in detail
    assert "captures 3.6 MiB" in detail  # 3,760,144 bytes: every key and side at [3, 1, 20000]
    normal = client.post("/activations", json=body((3, 32, 32), "stats"))  # alive, and a normal input runs
    assert normal.status_code == 200, normal.text


def test_an_input_the_model_cannot_take_is_refused_with_the_reason(make_client: ClientFactory, tmp_path: Path) -> None:
    """LeNet's unpadded 5x5 convolutions cannot take a 1-pixel row: told from the meta run, in the model's words."""
    client = make_client(write_lenet(tmp_path))
    response = client.post("/activations", json={**body((3, 1, 2000), "stats"), "model": "lenet"})
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert "lenet cannot run on samples of shape [3, 1, 2000] (its input size is [3, 32, 32])" in detail
    assert "Kernel size can't be greater than actual input size" in detail


BRANCHY_PY = '''
import torch
from torch import nn


class Branchy(nn.Module):
    """Branches on a value, so its shapes cannot be propagated on the meta device."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        y = self.conv(x)
        y = y if float(y.sum()) > 0 else -y
        return self.fc(y.mean((2, 3)))
'''

BRANCHY_CONFIG = """
[[models]]
name = "branchy"
source = "python"
architecture = "branchy.py:Branchy"
input_size = [3, 16, 16]
"""


def test_a_model_the_meta_device_cannot_run_is_probed_for_real_only_when_small(
    make_client: ClientFactory, tmp_path: Path
) -> None:
    """No larger than its input size: one real sample tells the shapes. Larger: refused with the reason."""
    (tmp_path / "branchy.py").write_text(BRANCHY_PY)
    client = make_client(BRANCHY_CONFIG, max_binary_response_bytes=1)
    small = client.post("/activations", json={**body((3, 4, 12), "safetensors"), "model": "branchy"})
    assert small.status_code == 413, small.text
    found = re.search(r"the binary answer would be (\d+) bytes", small.json()["detail"])
    assert found is not None, small.text
    conv, fc = 3 * 4 * 12 + 4 * 4 * 12, 4 + 2  # the conv's input and output, the linear layer's
    assert int(found.group(1)) == (conv + fc) * 4
    large = client.post("/activations", json={**body((3, 1, 1000), "stats"), "model": "branchy"})
    assert large.status_code == 422, large.text
    detail = large.json()["detail"]
    assert "cannot be told without running it" in detail
    assert "no larger than its input size [3, 16, 16]" in detail
