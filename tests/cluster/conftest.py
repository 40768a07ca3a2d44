"""One local Ray cluster for every Ray test (this package), on loopback, always shut down; and helpers.

`ray.init(num_cpus=2, include_dashboard=False)` on 127.0.0.1 with free ports, Ray's files in
a short temp dir that is removed afterwards, token auth off (Ray 2.60 turns it on). Serve's
HTTP proxy runs too, for the application Ray's own tooling deploys (`service.cluster.app:build`);
`python -m service.cluster` serves its own front on a port of its own.
The cluster starts only when a test asks for `ray_cluster`: the other tests here need no Ray.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psutil
import pytest

from service.cluster.grpc_ingress import SERVICER
from tests.reliability.live_server import REPO_ROOT

T = TypeVar("T")

# Set before anything imports ray (its constants are read at import): no token auth, and Ray's
# single-machine mode, which keeps every Ray address on 127.0.0.1 (otherwise it swaps loopback
# for the machine's own address). Ray's worker processes inherit both.
LOCAL_RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
os.environ.update(LOCAL_RAY_ENV)


# Ports below the kernel's ephemeral range (32768-60999 here) and above Ray's worker ports
# (10002-19999). Ray gives its own servers ports from bind(0) or a random one above that, and every
# outgoing connection takes an ephemeral one, so a port picked here and released stays free until the
# server it was picked for binds it. A bind(0) port did not: Ray's agents started meanwhile could take
# it, and a gRPC client then met an HTTP/1 server on the port meant for Serve's gRPC proxy.
QUIET_PORTS = range(20000, 32768)
_taken: set[int] = set()


def quiet_port() -> int:
    """A free loopback port in `QUIET_PORTS`, never handed out twice in this process."""
    for _ in range(200):
        port = random.choice(QUIET_PORTS)
        if port in _taken:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _taken.add(port)
        return port
    raise RuntimeError(f"no free port in {QUIET_PORTS}")


@dataclass(frozen=True)
class RayCluster:
    """Where the session's Ray cluster listens."""

    url: str  # Serve's HTTP proxy: http://127.0.0.1:PORT
    port: int  # its port
    grpc_port: int  # Serve's gRPC proxy, serving inference.GRPCInferenceService to the router deployment
    metrics_url: str  # Ray's metrics export of the node
    address: str  # the GCS address, for `python -m service.cluster --address`
    temp_dir: Path


@pytest.fixture(scope="package")  # shut down after the last test here, not held through the rest of the suite
def ray_cluster() -> Iterator[RayCluster]:
    import ray
    from ray import serve

    temp_dir = Path(tempfile.mkdtemp(prefix="hsray-", dir="/tmp"))  # short: Ray puts unix sockets in it
    metrics_port, http_port, grpc_port = quiet_port(), quiet_port(), quiet_port()
    try:
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            _temp_dir=str(temp_dir),
            _metrics_export_port=metrics_port,
            _system_config={"metrics_report_interval_ms": 1000},
            log_to_driver=False,
            configure_logging=False,
        )
        serve.start(
            http_options={"host": "127.0.0.1", "port": http_port},
            grpc_options={"port": grpc_port, "grpc_servicer_functions": [SERVICER]},
        )
        yield RayCluster(
            f"http://127.0.0.1:{http_port}",
            http_port,
            grpc_port,
            f"http://127.0.0.1:{metrics_port}/metrics",
            ray.get_runtime_context().gcs_address,
            temp_dir,
        )
    finally:
        try:
            if ray.is_initialized():
                serve.shutdown()
        finally:
            ray.shutdown()
            shutil.rmtree(temp_dir, ignore_errors=True)


def wait_for(condition: Callable[[], T | None], timeout: float, what: str, poll: float = 0.1) -> T:
    """Poll until `condition()` gives something truthy (returned); fail with `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(poll)


def wait_ready(url: str, timeout: float = 180.0) -> None:
    """Until the cluster's /readyz answers 200."""

    def ready() -> bool:
        try:
            return httpx.get(f"{url}/readyz", timeout=10).status_code == 200
        except httpx.TransportError:
            return False

    wait_for(ready, timeout, f"{url}/readyz", poll=0.25)


def replica_pids(app: str, deployment: str) -> list[int]:
    """PIDs of the Serve replica processes of one deployment.

    Their title is `ray::ServeReplica:APP:DEPLOYMENT`, with `.method` appended while a call runs.
    """
    title = f"ray::ServeReplica:{app}:{deployment}"
    pids = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        words = " ".join(proc.info["cmdline"] or []).split()
        if any(word == title or word.startswith(f"{title}.") for word in words):
            pids.append(int(proc.info["pid"]))
    return pids


def running_replicas(app: str, deployment: str) -> int:
    """Replicas Serve reports RUNNING for a deployment (0 while it is not healthy)."""
    from ray import serve

    status: Any = serve.status().applications.get(app)
    if status is None or deployment not in status.deployments:
        return 0
    overview = status.deployments[deployment]
    if str(overview.status.value) != "HEALTHY":
        return 0
    return int(overview.replica_states.get("RUNNING", 0))


class ClusterProcess:
    """`python -m service.cluster ...` as a subprocess on a port of its own, log kept.

    With a `cluster`, it deploys onto the session's Ray cluster (`--address`); without one, it starts
    its own local Ray as a user's command would: Ray's defaults (token auth on), no `RAY_*` or
    `HOOKSERVE_*` of this process, `HOME` as given in `env`.
    """

    def __init__(
        self, cluster: RayCluster | None, workdir: Path, args: list[str], env: dict[str, str] | None = None
    ) -> None:
        self.cluster = cluster
        self.port, self.grpc_port = quiet_port(), quiet_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / f"cluster-{self.port}.log"
        address = ["--address", cluster.address] if cluster is not None else []
        self.args = [sys.executable, "-m", "service.cluster", *address, *args]
        self.args += ["--host", "127.0.0.1", "--port", str(self.port), "--grpc-port", str(self.grpc_port)]
        if cluster is not None:
            base = {**os.environ, **LOCAL_RAY_ENV}
        else:
            base = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "HOOKSERVE_"))}
        self.env = {**base, "PYTHONPATH": str(REPO_ROOT), **(env or {})}
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 240.0) -> ClusterProcess:
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                self.args, cwd=REPO_ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )

        def ready() -> bool:
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"python -m service.cluster exited with {self.process.returncode}:\n{self.log()}")
            try:
                return httpx.get(f"{self.url}/readyz", timeout=10).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(ready, timeout, f"python -m service.cluster ready; log:\n{self.log()}", poll=0.25)
        return self

    def signal(self, signum: int = signal.SIGTERM) -> None:
        assert self.process is not None
        self.process.send_signal(signum)

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM and wait; SIGKILL only if it does not exit in time. The exit code."""
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
        return self.log_path.read_text(errors="replace")[-6000:] if self.log_path.exists() else ""
