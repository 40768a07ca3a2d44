"""A real `python -m service` on a free loopback port, and the model dirs the reliability tests serve.

`LiveServer` starts the process, waits for `/readyz`, and stops it (SIGTERM, then SIGKILL as a
last resort); its log is kept in a file so a failing test can show it. `write_lenet` and
`write_slow` put models into a model dir and return their TOML entries.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

import httpx

REPO_ROOT = Path(__file__).resolve().parents[2]

SLOW_MODEL = '''\
"""A test model whose input says what to do: x[0] > 0 sleeps that long, x[0] == -7 runs out of memory."""
import time

import torch
from torch import nn


class Slow(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flags = x.detach().reshape(x.shape[0], -1)[:, 0]
        if bool((flags == -7).any()):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        delay = float(flags.clamp(min=0).max())
        if delay > 0:
            time.sleep(delay)
        return self.body(x.reshape(x.shape[0], -1))
'''


def write_slow(model_dir: Path, name: str = "slow") -> str:
    """Write `slow.py` into `model_dir`; the TOML entry of a [1, 4, 4] model that sleeps on request."""
    (model_dir / "slow.py").write_text(SLOW_MODEL)
    return f"""
[[models]]
name = "{name}"
source = "python"
architecture = "slow.py:Slow"
input_size = [1, 4, 4]
max_batch_size = 1
max_batch_delay_ms = 0.0
"""


def slow_input(delay: float = 0.0, fill: float = 0.0) -> dict[str, object]:
    """A JSON tensor input for the slow model: sleeps `delay` s (-7: out of memory); `fill` elsewhere."""
    data = [delay] + [fill] * 15
    return {"tensor": {"shape": [1, 4, 4], "dtype": "float32", "data": data}}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class LiveServer:
    """`python -m service --config ... --model-dir ...` on 127.0.0.1:<free port>, as a context manager."""

    def __init__(self, model_dir: Path, config_text: str | None, env: dict[str, str] | None = None) -> None:
        """`config_text` None serves the built-in registry."""
        self.model_dir = model_dir
        self.config: Path | None = None
        if config_text is not None:
            self.config = model_dir / "models.toml"
            self.config.write_text(config_text)
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = model_dir / "server.log"
        self.env = {
            **os.environ,
            "HOOKSERVE_WORKER_THREADS": "1",
            "HOOKSERVE_CPU_THREADS": "2",
            "HOOKSERVE_TORCH_THREADS": "1",
            "HOOKSERVE_DECODE_THREADS": "2",
            "HOOKSERVE_LOG_LEVEL": "warning",
            "PYTHONPATH": str(REPO_ROOT),
            **(env or {}),
        }
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None, "server not started"
        return self.process.pid

    def start(self, timeout: float = 120.0) -> LiveServer:
        args = [sys.executable, "-m", "service", "--model-dir", str(self.model_dir)]
        if self.config is not None:
            args += ["--config", str(self.config)]
        args += ["--host", "127.0.0.1", "--port", str(self.port), "--device", "cpu"]
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(args, cwd=REPO_ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float) -> None:
        """Poll /readyz until 200; fail with the log if the process exits or time runs out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"{self.base_url}/readyz", timeout=2.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"server not ready after {timeout} s:\n{self.log()}")

    def peak_rss_bytes(self) -> int:
        """The server process's peak resident memory so far (Linux `VmHWM`)."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmHWM in /proc/<pid>/status")

    def signal(self, sig: signal.Signals) -> None:
        assert self.process is not None, "server not started"
        self.process.send_signal(sig)

    def wait(self, timeout: float) -> int:
        """The exit code once the process ends within `timeout` seconds."""
        assert self.process is not None, "server not started"
        return self.process.wait(timeout)

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM and wait; SIGKILL only if it does not exit in time. Returns the exit code."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        return self.process.returncode

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-8000:] if self.log_path.exists() else ""

    def __enter__(self) -> LiveServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
