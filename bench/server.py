"""The hookserve process under test: started as `python -m service` with chosen settings, stopped by PID."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import httpx

REPO = Path(__file__).resolve().parent.parent
BATCH_METRIC = re.compile(
    r'^hookserve_(?P<hooked>hooked_)?batch_size_(?P<what>count|sum)\{model="(?P<model>[^"]+)"\} (?P<value>\S+)$'
)


@dataclass(frozen=True)
class ServerConfig:
    """A named set of `HOOKSERVE_*` settings (env) the server runs with."""

    name: str
    description: str
    env: dict[str, str] = field(default_factory=dict)
    config_toml: str | None = None  # models TOML; None = the built-in registry

    def setting(self, key: str, default: str = "?") -> str:
        return self.env.get(f"HOOKSERVE_{key}", default)

    @property
    def torch_threads(self) -> int:
        return int(self.setting("TORCH_THREADS", "1"))


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


class Server:
    """`with Server(cfg, port, workdir) as s:` starts the service, waits for /readyz, stops it by PID on exit.

    `source` is the checkout whose `service` package runs: this one by default, or another commit's
    worktree (bench.baseline), run from there with `PYTHONPATH` pointing at it.
    """

    def __init__(
        self, cfg: ServerConfig, port: int, workdir: Path, ready_timeout_s: float = 300.0, source: Path = REPO
    ) -> None:
        self.cfg = cfg
        self.source = source
        self.port = port
        self.workdir = workdir
        self.ready_timeout_s = ready_timeout_s
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = workdir / f"server-{cfg.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError("server not started")
        return self.proc.pid

    def start(self) -> None:
        if port_in_use(self.port):
            raise RuntimeError(f"port {self.port} is already taken; pass --port")
        self.workdir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "service", "--host", "127.0.0.1", "--port", str(self.port)]
        cmd += ["--model-dir", str(self.workdir)]
        if self.cfg.config_toml is not None:
            toml = self.workdir / f"models-{self.cfg.name}.toml"
            toml.write_text(self.cfg.config_toml)
            cmd += ["--config", str(toml)]
        env = self.environment()
        if self.source != REPO and (origin := self.service_origin()) != self.source.resolve():
            raise RuntimeError(f"`python -m service` in {self.source} would run the package in {origin}")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, cwd=self.source, env=env, stdout=log, stderr=subprocess.STDOUT)
        self._wait_ready(self.proc)

    def environment(self) -> dict[str, str]:
        """This process's environment without `HOOKSERVE_*`, plus the config's settings; for another checkout,
        `PYTHONPATH` is that checkout alone (an editable install of the venv may point at yet another one)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("HOOKSERVE_")}
        env.update({"HOOKSERVE_LOG_LEVEL": "warning", **self.cfg.env})
        if self.source != REPO:
            env["PYTHONPATH"] = str(self.source)
        return env

    def service_origin(self) -> Path:
        """The checkout `python -m service` imports the package from, with this server's folder and environment."""
        code = "import pathlib, service; print(pathlib.Path(service.__file__).resolve().parent.parent)"
        done = subprocess.run(
            [sys.executable, "-c", code],
            cwd=self.source,
            env=self.environment(),
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        return Path(done.stdout.strip())

    def _wait_ready(self, proc: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        with httpx.Client(timeout=5.0, trust_env=False) as client:
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    raise RuntimeError(f"server exited with {proc.returncode}:\n{self.log_tail()}")
                try:
                    if client.get(self.url + "/readyz").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
        raise RuntimeError(f"server not ready after {self.ready_timeout_s:.0f} s:\n{self.log_tail()}")

    def batch_counters(self) -> dict[str, float]:
        """Batches run and samples batched so far, per model, from /metrics; {} if absent.

        Prediction batches (`hookserve_batch_size`) as `<model>.batches` and `<model>.samples`, hooked
        ones (`hookserve_hooked_batch_size`) as `<model>.hooked.batches` and `<model>.hooked.samples`.
        """
        try:
            text = httpx.get(self.url + "/metrics", timeout=10.0, trust_env=False).text
        except httpx.HTTPError:
            return {}
        out: dict[str, float] = {}
        for line in text.splitlines():
            found = BATCH_METRIC.match(line)
            if found:
                kind = "batches" if found["what"] == "count" else "samples"
                hooked = ".hooked" if found["hooked"] else ""
                out[f"{found['model']}{hooked}.{kind}"] = float(found["value"])
        return out

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM by PID (uvicorn shuts down gracefully), SIGKILL if it outlives `timeout_s`."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def __enter__(self) -> Server:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
