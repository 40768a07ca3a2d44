"""The cluster row of `make bench`: two single-thread Ray Serve replicas against one hookserve process.

Both serve resnet18 alone and get the same JPEG `/predict` (multipart) at 1 and 32 clients:
one `python -m service` with the default settings (its jobs share every core), and
`python -m service.cluster` on a local Ray cluster with 2 replicas of 1 CPU each (one torch
thread each), behind Ray's HTTP proxy and hookserve's router. The row gives images/s at 32
clients of both, and the p50 that Ray adds at 1 client.

    python -m bench.cluster --quick        # alone, a few seconds per point
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from bench.loadgen import CLIENTS, Client, format_result, measure
from bench.machine import wait_idle
from bench.server import REPO, Server, ServerConfig, free_port, port_in_use
from bench.workload import Kind, build_payloads, make_inputs

CORES = os.cpu_count() or 1
LOAD = (1, 32)
RESNET_TOML = '[[models]]\nname = "resnet18"\nsource = "torchvision"\narchitecture = "resnet18"\n'
BATCHING = {"HOOKSERVE_MAX_BATCH_SIZE": "8", "HOOKSERVE_MAX_BATCH_DELAY_MS": "5"}
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}  # loopback only, no token
ONE_PROCESS = ServerConfig(
    "one-process",
    f"python -m service, resnet18 only, Settings defaults ({CORES} executor threads sharing {CORES} cores)",
    {"HOOKSERVE_DECODE_THREADS": str(CORES), **BATCHING},
    RESNET_TOML,
)
REPLICAS = 2
RAY_LABEL = f"Ray Serve, {REPLICAS} replicas x 1 CPU (1 torch thread each), router and proxy in front"


def tree_pss_mb(pid: int) -> float:
    """Proportional set size of a process and all its descendants (Ray's GCS, raylet, proxy, replicas), MB."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return float("nan")
    total = 0
    for proc in procs:
        try:
            total += proc.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total / 1e6


def have_ray() -> bool:
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


class ClusterServer:
    """`python -m service.cluster` on its own local Ray cluster, stopped by PID (SIGTERM drains)."""

    def __init__(self, port: int, workdir: Path, ready_timeout_s: float = 600.0) -> None:
        self.port = port
        self.workdir = workdir
        self.url = f"http://127.0.0.1:{port}"
        self.ready_timeout_s = ready_timeout_s
        self.log_path = workdir / "cluster.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready_s = float("nan")

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError("cluster not started")
        return self.proc.pid

    def start(self) -> None:
        if port_in_use(self.port):
            raise RuntimeError(f"port {self.port} is already taken; pass --port")
        toml = self.workdir / "cluster-models.toml"
        toml.write_text(RESNET_TOML)
        ray_dir = Path(tempfile.mkdtemp(prefix="hsbray-", dir="/tmp"))  # short: Ray puts unix sockets in it
        self.ray_dir = ray_dir
        cmd = [sys.executable, "-m", "service.cluster", "--config", str(toml), "--model-dir", str(self.workdir)]
        cmd += ["--host", "127.0.0.1", "--port", str(self.port), "--replicas", str(REPLICAS), "--num-cpus", "1"]
        cmd += ["--ray-cpus", str(CORES), "--temp-dir", str(ray_dir)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("HOOKSERVE_")}
        env.update({"HOOKSERVE_LOG_LEVEL": "warning", **BATCHING, **RAY_ENV})
        started = time.monotonic()
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = started + self.ready_timeout_s
        with httpx.Client(timeout=5.0, trust_env=False) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"the cluster exited with {self.proc.returncode}:\n{self.log_tail()}")
                try:
                    if client.get(self.url + "/readyz").status_code == 200:
                        self.ready_s = time.monotonic() - started
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
        raise RuntimeError(f"the cluster was not ready after {self.ready_timeout_s:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout_s: float = 120.0) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        ray_dir = getattr(self, "ray_dir", None)
        if ray_dir is not None:
            shutil.rmtree(ray_dir, ignore_errors=True)

    def __enter__(self) -> ClusterServer:
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


def run(
    workdir: Path,
    log: Callable[[str], None],
    *,
    duration_s: float,
    max_requests: int,
    idle_wait_s: float,
    client: Client,
    port: int = 0,
) -> dict[str, Any]:
    """Both servers, one after the other, at each load; the results for `table`."""
    if not have_ray():
        log("cluster row skipped: ray is not installed (pip install 'hookserve[ray]')")
        return {"skipped": "ray is not installed"}
    payload = build_payloads(make_inputs(), [])[Kind.PREDICT_JPEG_MULTIPART]
    points: list[dict[str, Any]] = []
    footprint: dict[str, dict[str, float]] = {}

    def measure_all(server: str, url: str, pid: int | None) -> None:
        for clients in LOAD:
            wait_idle(idle_wait_s, log=log)
            result = measure(
                url, payload, clients, max_requests=max_requests, max_seconds=duration_s, server_pid=pid, client=client
            )
            log(f"  {server}: {format_result(result)}")
            points.append({"server": server, "concurrency": clients, "result": result.to_dict()})

    log(f"starting hookserve ({ONE_PROCESS.description})")
    started = time.monotonic()
    with Server(ONE_PROCESS, port or free_port(), workdir) as single:
        footprint["one-process"] = {"ready_s": time.monotonic() - started, "pss_mb": tree_pss_mb(single.pid)}
        measure_all("one-process", single.url, single.pid)
    log(f"starting python -m service.cluster ({RAY_LABEL})")
    with ClusterServer(port or free_port(), workdir) as cluster:
        footprint["ray"] = {"ready_s": cluster.ready_s, "pss_mb": tree_pss_mb(cluster.pid)}
        measure_all("ray", cluster.url, None)
    log(f"  ready after / memory (PSS): {footprint}")
    description = {"one-process": ONE_PROCESS.description, "ray": RAY_LABEL}
    return {"description": description, "points": points, "footprint": footprint}


def _point(results: dict[str, Any], server: str, clients: int) -> dict[str, Any] | None:
    for point in results.get("points", []):
        if point["server"] == server and point["concurrency"] == clients:
            found: dict[str, Any] = point["result"]
            return found
    return None


def table(results: dict[str, Any]) -> str:
    """The row: images/s at 32 clients of both, and Ray's added p50 at 1 client."""
    if not results or "skipped" in results:
        return f"cluster row: {results.get('skipped', 'not run') if results else 'not run'}"
    high = max(LOAD)
    rows = [
        "| | images/s, 32 clients | p50 ms, 1 client | ready after s | memory (PSS) MB |",
        "|---|---:|---:|---:|---:|",
    ]
    for server, label in (("one-process", "one hookserve process, both cores"), ("ray", RAY_LABEL)):
        busy, alone = _point(results, server, high), _point(results, server, 1)
        ips = f"{busy['images_per_s']:.1f}" if busy else "n/a"
        p50 = f"{alone['lat_ms']['p50']:.1f}" if alone else "n/a"
        foot = results.get("footprint", {}).get(server, {})
        ready, pss = foot.get("ready_s", float("nan")), foot.get("pss_mb", float("nan"))
        rows.append(f"| {label} | {ips} | {p50} | {ready:.1f} | {pss:.0f} |")
    single_busy, ray_busy = _point(results, "one-process", high), _point(results, "ray", high)
    single_alone, ray_alone = _point(results, "one-process", 1), _point(results, "ray", 1)
    if single_busy and ray_busy and single_alone and ray_alone and single_busy["images_per_s"]:
        ratio = ray_busy["images_per_s"] / single_busy["images_per_s"]
        added = ray_alone["lat_ms"]["p50"] - single_alone["lat_ms"]["p50"]
        rows.append(f"| Ray / one process | {ratio:.2f} x | {added:+.1f} ms added by Ray | | |")
    return "\n".join(rows)


def markdown(results: dict[str, Any]) -> str:
    """The section `RESULTS.md` gains (empty when the row was not run)."""
    cluster = results.get("cluster")
    if not cluster:
        return ""
    return (
        "\n## Cluster: Ray Serve replicas against one process\n\n"
        "resnet18 `/predict` with the JPEG as a multipart upload (`bench/cluster.py`).\n\n" + table(cluster) + "\n"
    )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.cluster", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--duration", type=float, default=15.0, help="max measured seconds per point (default 15)")
    ap.add_argument("--requests", type=int, default=5000, help="max measured requests per point (default 5000)")
    ap.add_argument("--idle-wait", type=float, default=120.0, help="max seconds to wait for an idle machine")
    ap.add_argument("--quick", action="store_true", help="3 s per point, 10 s idle wait: for trying")
    ap.add_argument("--client", choices=CLIENTS, default="wire", help="load generator's HTTP client")
    args = ap.parse_args(argv)
    if args.quick:
        args.duration, args.idle_wait = min(args.duration, 3.0), min(args.idle_wait, 10.0)

    def log(msg: str) -> None:
        print(f"[{dt.datetime.now().strftime('%H:%M:%S')}] {msg}", flush=True)

    with tempfile.TemporaryDirectory(prefix="hookserve-bench-cluster-") as tmp:
        results = run(
            Path(tmp),
            log,
            duration_s=args.duration,
            max_requests=args.requests,
            idle_wait_s=args.idle_wait,
            client=args.client,
        )
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
