"""`python -m service.cluster`: serve hookserve's HTTP API through Ray Serve, replicated or sharded.

Without `--address` it starts a local Ray cluster; with one it deploys onto that cluster.
SIGTERM or Ctrl-C drains: Serve lets every replica finish its in-flight requests (within
HOOKSERVE_SHUTDOWN_GRACE_S), runs each app's shutdown, and the command exits 0.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from service.errors import InvalidField

log = logging.getLogger("hookserve.cluster")


def parse_args(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        prog="python -m service.cluster", description="hookserve on Ray Serve: replicas and model groups"
    )
    parser.add_argument("--config", type=Path, help="models TOML, with an optional [cluster] table")
    parser.add_argument("--model-dir", type=Path, help="root of every server-side path (the same on every node)")
    parser.add_argument("--device", help="auto | cpu | cuda | cuda:N | mps, in every replica")
    parser.add_argument("--host", help="HTTP address of Serve's proxy (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="HTTP port of Serve's proxy (default 8000)")
    parser.add_argument("--grpc-port", help="gRPC port of Serve's gRPC proxy (default 8001; off: none)")
    parser.add_argument("--address", help="an existing Ray cluster (e.g. 10.0.0.1:6379 or auto); default: start one")
    parser.add_argument("--layout", choices=["replicated", "sharded"], help="default replicated (or [cluster] layout)")
    parser.add_argument("--replicas", type=int, help="replicas per group")
    parser.add_argument("--min-replicas", type=int, help="autoscaling lower bound per group")
    parser.add_argument("--max-replicas", type=int, help="autoscaling upper bound per group")
    parser.add_argument("--target-ongoing-requests", type=float, help="autoscaling target per replica")
    parser.add_argument("--num-cpus", type=float, help="CPUs per replica (default 1; sets its thread counts)")
    parser.add_argument("--num-gpus", type=float, help="GPUs per replica, fractions allowed (0.5: two per GPU)")
    parser.add_argument(
        "--group", dest="groups", action="append", metavar="NAME=MODEL,...", help="a model group (sharded); repeat"
    )
    parser.add_argument("--app-name", help="Serve application name (default hookserve)")
    parser.add_argument("--router-replicas", type=int, help="replicas of the router (default 1)")
    parser.add_argument("--ray-cpus", type=float, help="CPUs of the local Ray cluster this command starts")
    parser.add_argument("--ray-gpus", type=float, help="GPUs of the local Ray cluster this command starts")
    parser.add_argument("--temp-dir", type=Path, help="Ray's session files for the local cluster (default /tmp/ray)")
    args = parser.parse_args(argv)
    return {k: v for k, v in vars(args).items() if v is not None}


class Stop:
    """SIGTERM / SIGINT set an event the main thread waits on (the first one only; the drain is not cut)."""

    def __init__(self) -> None:
        self.event = threading.Event()

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if not self.event.is_set():
            log.info("signal %d: draining", signum)
        self.event.set()

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self)
        signal.signal(signal.SIGINT, self)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    try:
        from service.cluster.app import application, make_plan

        settings, plan = make_plan(args)
    except (InvalidField, OSError) as exc:
        print(f"python -m service.cluster: {exc}", file=sys.stderr)
        return 2
    import ray
    from ray import serve

    from service.cluster.grpc_ingress import grpc_options

    own_cluster = "address" not in args
    init: dict[str, Any] = {"address": args.get("address")}
    if own_cluster:
        init.update({k: v for k, v in (("num_cpus", args.get("ray_cpus")), ("num_gpus", args.get("ray_gpus"))) if v})
        if "temp_dir" in args:
            init["_temp_dir"] = str(Path(args["temp_dir"]).resolve())
    ray.init(**init)
    stop = Stop()
    stop.install()  # after ray.init, which installs a SIGTERM handler of its own (sys.exit) over any earlier one
    app_name = plan.cluster.app_name
    try:
        serve.start(http_options={"host": settings.host, "port": settings.port}, grpc_options=grpc_options(settings))
        serve.run(application(plan), name=app_name, route_prefix="/", blocking=False)
        groups = ", ".join(f"{g.name} ({', '.join(g.models) or 'built-in models'})" for g in plan.groups)
        log.info(
            "serving on http://%s:%d: %s layout, groups %s", settings.host, settings.port, plan.cluster.layout, groups
        )
        stop.event.wait()
    finally:
        log.info("stopping %s: in-flight requests finish first", app_name)
        if own_cluster:
            serve.shutdown()
        else:
            serve.delete(app_name)
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
