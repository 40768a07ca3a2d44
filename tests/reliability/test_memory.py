"""Memory returned: after large legal requests the server's resident memory comes back near its baseline.

Two things kept it up before: worker threads held their last batch (inputs, captures, answers) while
they waited for the next one, and glibc's allocator kept the freed pages of large tensors in its arenas.
"""

from __future__ import annotations

import base64
import time
from pathlib import Path

import httpx
import psutil
import torch

from tests.helpers.waiting import PATIENCE_S
from tests.helpers.wide import WIDE_PY
from tests.reliability.live_server import LiveServer

MIB = 1024 * 1024
SIDE = 384  # 64 channels of 384x384 float32: 36 MiB per layer side per input
INPUTS = 6
SETTLED_WITHIN = 64 * MIB  # RSS after the large requests, over the baseline taken after a small one
# (measured: +645 MiB when threads kept their last batch, +93 MiB without the allocator trim, +2 MiB with both)

CONFIG = f"""
[[models]]
name = "wide"
source = "python"
architecture = "wide.py:Wide"
input_size = [3, {SIDE}, {SIDE}]
max_batch_size = 1
"""


def _body(n: int) -> dict[str, object]:
    generator = torch.Generator().manual_seed(n)
    inputs = [
        {
            "tensor": {
                "shape": [3, SIDE, SIDE],
                "dtype": "float32",
                "b64": _b64(torch.rand(3, SIDE, SIDE, generator=generator)),
            }
        }
        for _ in range(n)
    ]
    return {"model": "wide", "inputs": inputs, "layers": ["*"], "capture": "both", "format": "safetensors"}


def _b64(x: torch.Tensor) -> str:
    return base64.b64encode(x.numpy().tobytes()).decode()


def _rss(pid: int) -> int:
    return int(psutil.Process(pid).memory_info().rss)


def _settled_rss(pid: int, baseline: int, timeout: float) -> int:
    """Poll the RSS until it is within SETTLED_WITHIN of `baseline` (or `timeout` passes); the last reading."""
    proc = psutil.Process(pid)
    deadline = time.monotonic() + timeout
    rss = int(proc.memory_info().rss)
    while rss > baseline + SETTLED_WITHIN and time.monotonic() < deadline:
        time.sleep(0.2)
        rss = int(proc.memory_info().rss)
    return rss


def test_rss_returns_near_its_baseline_after_large_requests(tmp_path: Path) -> None:
    (tmp_path / "wide.py").write_text(WIDE_PY)
    env = {
        "HOOKSERVE_MAX_REQUEST_MEMORY_BYTES": str(8192 * MIB),
        "HOOKSERVE_MEMORY_BUDGET_BYTES": str(8192 * MIB),
        "HOOKSERVE_MAX_BINARY_RESPONSE_BYTES": str(4096 * MIB),
    }
    with LiveServer(tmp_path, CONFIG, env=env) as server, httpx.Client(timeout=PATIENCE_S * 2) as client:
        url = f"{server.base_url}/activations"
        small = client.post(url, json=_body(1))
        assert small.status_code == 200, small.text
        baseline = _rss(server.pid)
        peak_before = server.peak_rss_bytes()
        for _ in range(3):
            large = client.post(url, json=_body(INPUTS))
            assert large.status_code == 200, large.text
            assert len(large.content) > 500 * MIB  # the requests really were large
        peak = server.peak_rss_bytes()
        assert peak - peak_before > 700 * MIB, "the large requests did not raise the peak: the test proves nothing"
        settled = _settled_rss(server.pid, baseline, timeout=10.0)
    assert settled <= baseline + SETTLED_WITHIN, (
        f"RSS {settled / MIB:.0f} MiB after the large requests (peak {peak / MIB:.0f} MiB) stayed over "
        f"the baseline {baseline / MIB:.0f} MiB + {SETTLED_WITHIN / MIB:.0f} MiB"
    )
