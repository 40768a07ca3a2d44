"""The cluster row of `make bench`: two single-thread Ray Serve replicas against one hookserve process.

Both serve resnet18 and lenet and get the same JPEG `/predict` (multipart) of resnet18 at 1
and 32 clients, and lenet `/predict` at 1 client (~1 ms of compute: what Ray's hops add shows
best there): one `python -m service` with the default settings (its jobs share every core), and
`python -m service.cluster` on a local Ray cluster with 2 replicas of 1 CPU each (one torch
thread each), behind Ray's HTTP proxy and hookserve's router. The row gives images/s at 32
clients of both, the p50 that Ray adds at 1 client, how long each took to be ready and its
memory (PSS of the whole process tree).

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
from service.cluster.spec_toml import specs_toml
from service.registry.builtin import ZOO_DIR, builtin_specs
from service.specs.model import ModelSpec, Source

CORES = os.cpu_count() or 1
LOAD = (1, 32)
BATCHING = {"HOOKSERVE_MAX_BATCH_SIZE": "8", "HOOKSERVE_MAX_BATCH_DELAY_MS": "5"}
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}  # loopback only, no token
RESNET = ModelSpec(name="resnet18", source=Source.torchvision, architecture="resnet18")


def models_toml(workdir: Path) -> str:
    """resnet18 (random weights) and the shipped lenet, its files copied into the model dir."""
    (lenet,) = [s for s in builtin_specs() if s.name == "lenet"]
    for relative in (lenet.weights, lenet.labels):
        assert relative is not None
        (workdir / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ZOO_DIR / relative, workdir / relative)
    return specs_toml([RESNET, lenet])


ONE_PROCESS_TEXT = f"python -m service, resnet18 and lenet, Settings defaults ({CORES} executor threads, {CORES} cores)"
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
        toml.write_text(models_toml(self.workdir))
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
    payloads = build_payloads(make_inputs(), [])
    points: list[dict[str, Any]] = []
    footprint: dict[str, dict[str, float]] = {}
    plan = [*((Kind.PREDICT_JPEG_MULTIPART, c) for c in LOAD), (Kind.LENET_PREDICT, 1)]

    def measure_all(server: str, url: str, pid: int | None) -> None:
        for kind, clients in plan:
            wait_idle(idle_wait_s, log=log)
            result = measure(
                url,
                payloads[kind],
                clients,
                max_requests=max_requests,
                max_seconds=duration_s,
                server_pid=pid,
                client=client,
            )
            log(f"  {server}: {format_result(result)}")
            points.append({"server": server, "kind": kind.value, "concurrency": clients, "result": result.to_dict()})

    one_process = ServerConfig(
        "one-process", ONE_PROCESS_TEXT, {"HOOKSERVE_DECODE_THREADS": str(CORES), **BATCHING}, models_toml(workdir)
    )
    log(f"starting hookserve ({ONE_PROCESS_TEXT})")
    started = time.monotonic()
    with Server(one_process, port or free_port(), workdir) as single:
        footprint["one-process"] = {"ready_s": time.monotonic() - started, "pss_mb": tree_pss_mb(single.pid)}
        measure_all("one-process", single.url, single.pid)
    log(f"starting python -m service.cluster ({RAY_LABEL})")
    with ClusterServer(port or free_port(), workdir) as cluster:
        footprint["ray"] = {"ready_s": cluster.ready_s, "pss_mb": tree_pss_mb(cluster.pid)}
        measure_all("ray", cluster.url, None)
    log(f"  ready after / memory (PSS): {footprint}")
    description = {"one-process": ONE_PROCESS_TEXT, "ray": RAY_LABEL}
    return {"description": description, "points": points, "footprint": footprint}


def _point(
    results: dict[str, Any], server: str, clients: int, kind: Kind = Kind.PREDICT_JPEG_MULTIPART
) -> dict[str, Any] | None:
    for point in results.get("points", []):
        if point["server"] == server and point["concurrency"] == clients and point.get("kind") == kind.value:
            found: dict[str, Any] = point["result"]
            return found
    return None


def table(results: dict[str, Any]) -> str:
    """The row: images/s at 32 clients of both, and Ray's added p50 at 1 client."""
    if not results or "skipped" in results:
        return f"cluster row: {results.get('skipped', 'not run') if results else 'not run'}"
    high = max(LOAD)
    rows = [
        "| | resnet18 images/s, 32 clients | resnet18 p50 ms, 1 client | lenet p50 ms, 1 client "
        "| ready after s | memory (PSS) MB |",
        "|---|---:|---:|---:|---:|---:|",
    ]

    def p50(point: dict[str, Any] | None) -> str:
        return f"{point['lat_ms']['p50']:.1f}" if point else "n/a"

    for server, label in (("one-process", "one hookserve process, both cores"), ("ray", RAY_LABEL)):
        busy = _point(results, server, high)
        ips = f"{busy['images_per_s']:.1f}" if busy else "n/a"
        alone, lenet = _point(results, server, 1), _point(results, server, 1, Kind.LENET_PREDICT)
        foot = results.get("footprint", {}).get(server, {})
        ready, pss = foot.get("ready_s", float("nan")), foot.get("pss_mb", float("nan"))
        rows.append(f"| {label} | {ips} | {p50(alone)} | {p50(lenet)} | {ready:.1f} | {pss:.0f} |")
    single, ray = _point(results, "one-process", high), _point(results, "ray", high)
    cells = ["n/a", "n/a", "n/a"]
    if single and ray and single["images_per_s"]:
        cells[0] = f"{ray['images_per_s'] / single['images_per_s']:.2f} x"
    for i, kind in ((1, Kind.PREDICT_JPEG_MULTIPART), (2, Kind.LENET_PREDICT)):
        one, many = _point(results, "one-process", 1, kind), _point(results, "ray", 1, kind)
        if one and many:
            cells[i] = f"{many['lat_ms']['p50'] - one['lat_ms']['p50']:+.1f} ms"
    rows.append(f"| Ray against one process | {cells[0]} | {cells[1]} | {cells[2]} | | |")
    return "\n".join(rows)


def markdown(results: dict[str, Any]) -> str:
    """The section `RESULTS.md` gains (empty when the row was not run)."""
    cluster = results.get("cluster")
    if not cluster:
        return ""
    return (
        "\n## Cluster: Ray Serve replicas against one process\n\n"
        "resnet18 `/predict` with the JPEG as a multipart upload, lenet `/predict` with a PNG "
        "(`bench/cluster.py`).\n\n" + table(cluster) + "\n"
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
