"""The cluster row of `make bench`: two single-thread Ray Serve replicas against one hookserve process.

Both serve resnet18 and lenet and get the same JPEG `/predict` (multipart) of resnet18 at 1
and 32 clients, and lenet `/predict` at 1 client (~1 ms of compute: what the cluster adds per
request shows best there): one `python -m service` with the default settings (its jobs share
every core), and `python -m service.cluster` on a local Ray cluster with 2 replicas of 1 CPU
each (one torch thread each), behind the command's own front. The row gives images/s at 32
clients of both and images per CPU-second (the CPU of each whole process tree: the cluster's
front, Ray's daemons and the replicas), the p50 that the cluster adds at 1 client, how long
each took to be ready and its memory (PSS of the whole process tree).

Where the added time goes is measured on the running cluster (lenet at 1 client, p50 of each):
the request over HTTP through the front, the same request sent by DeploymentHandle straight to
a replica (no HTTP, no front), an empty handle call (Ray's hop alone), and the same request
through the app in this process (the app's own time).

    python -m bench.cluster --quick                        # alone, a few seconds per point
    python -m bench.cluster --write-docs docs/cluster.md   # the run whose numbers the page shows
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import math
import os
import re
import shutil
import signal
import statistics
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
from bench.machine import machine_info, wait_idle
from bench.server import REPO, Server, ServerConfig, free_port, port_in_use
from bench.workload import Kind, build_payloads, make_inputs
from service.cluster.local_ray import FRONT_ENV
from service.cluster.spec_toml import specs_toml
from service.registry.builtin import ZOO_DIR, builtin_specs
from service.specs.model import ModelSpec, Source

CORES = os.cpu_count() or 1
LOAD = (1, 32)
BATCHING = {"HOOKSERVE_MAX_BATCH_SIZE": "8", "HOOKSERVE_MAX_BATCH_DELAY_MS": "5"}
# One machine, loopback only: token auth off so that this process can reach the replicas for the breakdown
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
BREAKDOWN_CALLS = 300
DOCS_START, DOCS_END = "<!-- bench.cluster:start -->", "<!-- bench.cluster:end -->"
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
# both sides measured over HTTP alone: no gRPC or TorchServe management port (their fixed defaults may be taken)
HTTP_ONLY = {"HOOKSERVE_GRPC_PORT": "off", "HOOKSERVE_TORCHSERVE_MANAGEMENT_PORT": "off"}
RAY_LABEL = f"python -m service.cluster, {REPLICAS} replicas x 1 CPU (1 torch thread each) behind its front"


def _tree_sum(pid: int, measure: Callable[[Any], float]) -> float:
    """`measure` summed over a process and all its descendants (those gone meanwhile left out); NaN if it is gone."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return float("nan")
    total = 0.0
    for proc in procs:
        try:
            total += measure(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total


def tree_pss_mb(pid: int) -> float:
    """Proportional set size of a process and all its descendants (Ray's GCS, raylet, proxy, replicas), MB."""
    return _tree_sum(pid, lambda proc: float(proc.memory_full_info().pss)) / 1e6


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and all its descendants, those they have reaped included."""

    def cpu(proc: Any) -> float:
        t = proc.cpu_times()
        return float(t.user + t.system + t.children_user + t.children_system)

    return _tree_sum(pid, cpu)


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
        env.update({"HOOKSERVE_LOG_LEVEL": "warning", **BATCHING, **RAY_ENV, **HTTP_ONLY})
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

    def gcs_address(self) -> str:
        """The address of the Ray cluster the command started (it logs it once Ray is up)."""
        found = re.search(r"Ray at (\S+);", self.log_path.read_text(errors="replace"))
        if found is None:
            raise RuntimeError(f"no Ray address in the log:\n{self.log_tail()}")
        return found.group(1)

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


def _p50(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


async def _timed(call: Callable[[], Any], n: int) -> float:
    """p50 in ms of `n` awaited calls, after a few unmeasured ones."""
    for _ in range(10):
        await call()
    lat = []
    for _ in range(n):
        started = time.perf_counter()
        await call()
        lat.append((time.perf_counter() - started) * 1000.0)
    return _p50(lat)


def breakdown(workdir: Path, address: str, app: str, payload: Any, n: int = BREAKDOWN_CALLS) -> dict[str, float]:
    """p50s (ms) of one lenet request by handle straight to a replica, of an empty handle call, and through the app
    in this process (one thread, as in each replica): the parts of what the cluster adds (see the module doc)."""
    import ray
    from ray.serve.handle import DeploymentHandle

    from service.cluster.asgi_host import AppHost
    from service.cluster.messages import ForwardRequest
    from service.config import Settings
    from service.main import create_app

    headers = [(k.lower().encode(), v.encode()) for k, v in payload.headers.items()]
    headers.append((b"content-length", str(len(payload.content)).encode()))
    request = ForwardRequest("POST", payload.path, b"", headers, payload.content)
    toml = workdir / "breakdown-models.toml"
    toml.write_text(models_toml(workdir))
    out: dict[str, float] = {}

    async def through_ray() -> None:  # as the front calls: over Serve's gRPC, the router on this loop
        group = DeploymentHandle("group-models", app)
        forward = group.options(method_name="forward", _by_reference=False)
        empty = group.options(method_name="check_health", _by_reference=False)
        try:
            answer = await forward.remote(request)
            if answer.status != 200:
                raise RuntimeError(f"breakdown: the replica answered {answer.status}: {answer.body[:200]!r}")
            out["handle_ms"] = await _timed(lambda: forward.remote(request), n)
            out["empty_handle_ms"] = await _timed(empty.remote, n)
        finally:
            await group.shutdown_async()

    async def in_process() -> None:
        settings = Settings(
            model_dir=workdir,
            config=toml,
            log_level="warning",
            worker_threads=1,
            cpu_threads=1,
            torch_threads=1,
            decode_threads=1,
            grpc_port=None,  # the app alone, as in a replica: no side fronts on their fixed ports
            torchserve_management_port=None,
        )
        host = AppHost(create_app(settings))
        await host.start()
        try:
            for _ in range(600):
                if (await host.call(request)).status == 200:
                    break
                await asyncio.sleep(0.1)
            out["app_ms"] = await _timed(lambda: host.call(request), n)
        finally:
            await host.stop()

    ray.init(address=address, log_to_driver=False, configure_logging=False)
    try:
        asyncio.run(through_ray())
    finally:
        ray.shutdown()
    asyncio.run(in_process())
    return out


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
    os.environ.update({**RAY_ENV, **FRONT_ENV})  # before Ray starts here (the breakdown calls as the front does)
    if not have_ray():
        log("cluster row skipped: ray is not installed (pip install 'hookserve[ray]')")
        return {"skipped": "ray is not installed"}
    payloads = build_payloads(make_inputs(), [])
    points: list[dict[str, Any]] = []
    footprint: dict[str, dict[str, float]] = {}
    plan = [*((Kind.PREDICT_JPEG_MULTIPART, c) for c in LOAD), (Kind.LENET_PREDICT, 1)]

    def measure_all(server: str, url: str, pid: int) -> None:
        for kind, clients in plan:
            wait_idle(idle_wait_s, log=log)
            result = measure(
                url,
                payloads[kind],
                clients,
                max_requests=max_requests,
                max_seconds=duration_s,
                server_pid=pid,
                counters=lambda: {"tree_cpu_s": tree_cpu_seconds(pid)},
                client=client,
            )
            tree = result.extra.get("tree_cpu_s", float("nan"))
            result.extra["images_per_cpu_s"] = result.ok * payloads[kind].images / tree if tree > 0 else float("nan")
            # busy cores of the machine that were neither the load generator nor the server's process tree
            result.other_cores = max(0.0, result.machine_cores - result.loadgen_cores - tree / result.wall_s)
            log(f"  {server}: {format_result(result)}  tree CPU {tree:.1f} s")
            points.append({"server": server, "kind": kind.value, "concurrency": clients, "result": result.to_dict()})

    one_process = ServerConfig(
        "one-process",
        ONE_PROCESS_TEXT,
        {"HOOKSERVE_DECODE_THREADS": str(CORES), **BATCHING, **HTTP_ONLY},
        models_toml(workdir),
    )
    log(f"starting hookserve ({ONE_PROCESS_TEXT})")
    started = time.monotonic()
    with Server(one_process, port or free_port(), workdir) as single:
        footprint["one-process"] = {"ready_s": time.monotonic() - started, "pss_mb": tree_pss_mb(single.pid)}
        measure_all("one-process", single.url, single.pid)
    log(f"starting python -m service.cluster ({RAY_LABEL})")
    parts: dict[str, float] = {}
    with ClusterServer(port or free_port(), workdir) as cluster:
        footprint["ray"] = {"ready_s": cluster.ready_s, "pss_mb": tree_pss_mb(cluster.pid)}
        measure_all("ray", cluster.url, cluster.pid)
        wait_idle(idle_wait_s, log=log)
        parts = breakdown(workdir, cluster.gcs_address(), "hookserve", payloads[Kind.LENET_PREDICT])
        log(f"  where the time goes (p50 ms): {parts}")
    log(f"  ready after / memory (PSS): {footprint}")
    description = {"one-process": ONE_PROCESS_TEXT, "ray": RAY_LABEL}
    return {
        "description": description,
        "points": points,
        "footprint": footprint,
        "breakdown": parts,
        "machine": machine_info(),
        "when": dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
    }


def _point(
    results: dict[str, Any], server: str, clients: int, kind: Kind = Kind.PREDICT_JPEG_MULTIPART
) -> dict[str, Any] | None:
    for point in results.get("points", []):
        if point["server"] == server and point["concurrency"] == clients and point.get("kind") == kind.value:
            found: dict[str, Any] = point["result"]
            return found
    return None


def _known(value: float | None) -> bool:
    return value is not None and not math.isnan(value)


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return format(value, spec) if value is not None and _known(value) else "n/a"


def table(results: dict[str, Any]) -> str:
    """The row: images/s and images per CPU-second at 32 clients of both, and the cluster's added p50 at 1 client."""
    if not results or "skipped" in results:
        return f"cluster row: {results.get('skipped', 'not run') if results else 'not run'}"
    high = max(LOAD)
    rows = [
        f"| | resnet18 images/s, {high} clients | images per CPU-second | CPU cores used "
        "| resnet18 p50 ms, 1 client | lenet p50 ms, 1 client | ready after s | memory (PSS) MB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def p50(point: dict[str, Any] | None) -> str:
        return _fmt(point["lat_ms"]["p50"]) if point else "n/a"

    def per_cpu(point: dict[str, Any] | None) -> float | None:
        return point["extra"].get("images_per_cpu_s") if point else None

    def cores(point: dict[str, Any] | None) -> float | None:
        return point["extra"]["tree_cpu_s"] / point["wall_s"] if point and "tree_cpu_s" in point["extra"] else None

    ray_label = results.get("description", {}).get("ray", RAY_LABEL)  # as measured: older runs served differently
    for server, label in (("one-process", "one hookserve process, both cores"), ("ray", ray_label)):
        busy = _point(results, server, high)
        alone, lenet = _point(results, server, 1), _point(results, server, 1, Kind.LENET_PREDICT)
        foot = results.get("footprint", {}).get(server, {})
        rows.append(
            f"| {label} | {_fmt(busy['images_per_s'] if busy else None)} | {_fmt(per_cpu(busy))} "
            f"| {_fmt(cores(busy), '.2f')} | {p50(alone)} | {p50(lenet)} "
            f"| {_fmt(foot.get('ready_s'))} | {_fmt(foot.get('pss_mb'), '.0f')} |"
        )
    single, ray = _point(results, "one-process", high), _point(results, "ray", high)
    cells = ["n/a"] * 4
    if single and ray and single["images_per_s"]:
        cells[0] = f"{ray['images_per_s'] / single['images_per_s']:.2f} x"
    one_cpu, ray_cpu = per_cpu(single), per_cpu(ray)
    if one_cpu and ray_cpu and _known(one_cpu) and _known(ray_cpu):
        cells[1] = f"**{ray_cpu / one_cpu:.2f} x**"
    for i, kind in ((2, Kind.PREDICT_JPEG_MULTIPART), (3, Kind.LENET_PREDICT)):
        one, many = _point(results, "one-process", 1, kind), _point(results, "ray", 1, kind)
        if one and many:
            added = f"{many['lat_ms']['p50'] - one['lat_ms']['p50']:+.1f} ms"
            cells[i] = f"**{added}**" if kind is Kind.LENET_PREDICT else added
    rows.append(f"| cluster against one process | {cells[0]} | {cells[1]} | | {cells[2]} | {cells[3]} | | |")
    return "\n".join(rows)


def breakdown_table(results: dict[str, Any]) -> str:
    """Where the cluster's added p50 at 1 client goes, on lenet (ms)."""
    parts = results.get("breakdown") or {}
    cluster, single = (
        _point(results, "ray", 1, Kind.LENET_PREDICT),
        _point(results, "one-process", 1, Kind.LENET_PREDICT),
    )
    if not parts or not cluster or not single:
        return ""
    http, one = cluster["lat_ms"]["p50"], single["lat_ms"]["p50"]
    handle, empty, app = parts["handle_ms"], parts["empty_handle_ms"], parts["app_ms"]
    rows = [
        "| lenet `/predict`, 1 client, p50 | ms |",
        "|---|---:|",
        f"| through the front over HTTP (the client's view) | {http:.1f} |",
        f"| the same request by handle straight to a replica (no HTTP, no front) | {handle:.1f} |",
        f"| an empty handle call (Ray's hop alone) | {empty:.1f} |",
        f"| the request through the app in one process, no HTTP (the app's own time) | {app:.1f} |",
        f"| one process over HTTP | {one:.1f} |",
        f"| **the front: HTTP in and out, routing** (front - handle) | {http - handle:+.1f} |",
        f"| **Ray's hop** (empty call) | {empty:+.1f} |",
        f"| **the request and answer through Ray** (handle - empty - app) | {handle - empty - app:+.1f} |",
        f"| one process's own HTTP (one process - app) | {one - app:+.1f} |",
    ]
    return "\n".join(rows)


def markdown(results: dict[str, Any]) -> str:
    """The section `RESULTS.md` gains (empty when the row was not run)."""
    cluster = results.get("cluster")
    if not cluster:
        return ""
    return (
        "\n## Cluster: Ray Serve replicas against one process\n\n"
        "resnet18 `/predict` with the JPEG as a multipart upload, lenet `/predict` with a PNG "
        "(`bench/cluster.py`).\n\n" + table(cluster) + "\n\n" + breakdown_table(cluster) + "\n"
    )


def docs_block(results: dict[str, Any], command: str) -> str:
    """The measured section of docs/cluster.md, between its markers: how it was made, then the tables."""
    machine = results.get("machine", {})
    others = [
        p["result"]["other_cores"]
        for p in results.get("points", [])
        if p["result"].get("other_cores") == p["result"].get("other_cores")
    ]
    busy = f"{min(others):.2f} to {max(others):.2f}" if others else "unknown"
    return "\n".join(
        [
            DOCS_START,
            f"`{command}` on {results.get('when', '?')}: {machine.get('cores', '?')} cores ({machine.get('cpu', '?')}),"
            f" {machine.get('mem_gib', '?')} GiB. Other processes used {busy} cores during the points"
            " (0 on a quiet machine); the lead reruns it on a quiet machine for `bench/RESULTS.md`.",
            "",
            table(results),
            "",
            breakdown_table(results),
            DOCS_END,
        ]
    )


def write_docs(path: Path, results: dict[str, Any], command: str) -> None:
    """Replace the measured block of the page (between its markers) with this run's."""
    text = path.read_text()
    pattern = re.compile(re.escape(DOCS_START) + ".*?" + re.escape(DOCS_END), flags=re.DOTALL)
    if not pattern.search(text):
        raise SystemExit(f"{path} has no {DOCS_START} ... {DOCS_END} block")
    path.write_text(pattern.sub(lambda _: docs_block(results, command), text))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.cluster", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--duration", type=float, default=15.0, help="max measured seconds per point (default 15)")
    ap.add_argument("--requests", type=int, default=5000, help="max measured requests per point (default 5000)")
    ap.add_argument("--idle-wait", type=float, default=120.0, help="max seconds to wait for an idle machine")
    ap.add_argument("--quick", action="store_true", help="3 s per point, 10 s idle wait: for trying")
    ap.add_argument("--client", choices=CLIENTS, default="wire", help="load generator's HTTP client")
    ap.add_argument("--write-docs", type=Path, metavar="PAGE", help="put this run's tables into PAGE's measured block")
    ap.add_argument("--json", type=Path, help="write the raw results here")
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
    print()
    print(breakdown_table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    if args.write_docs and "skipped" not in results:
        write_docs(args.write_docs, results, "python -m bench.cluster " + " ".join(argv or sys.argv[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
