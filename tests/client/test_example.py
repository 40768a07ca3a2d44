"""`examples/lenet_head.py` runs against a live server, and its new head classifies the held-out digits."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.reliability.live_server import REPO_ROOT, LiveServer


def test_the_lenet_head_example_runs_and_learns(live: LiveServer, tmp_path: Path) -> None:
    command = [sys.executable, str(REPO_ROOT / "examples" / "lenet_head.py"), "--url", live.base_url]
    command += ["--workdir", str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    first = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "features: 1797 images (0 from an earlier run), failed: 0" in first.stdout
    found = re.search(r"conv features (\d\.\d+), LeNet's own head (\d\.\d+)", first.stdout)
    assert found, first.stdout
    assert float(found.group(1)) >= 0.9
    assert float(found.group(2)) >= 0.95
    again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "features: 1797 images (1797 from an earlier run), failed: 0" in again.stdout
