"""`python -m service.cluster`: serve hookserve's HTTP API from model replicas on Ray Serve, replicated or sharded.

Without `--address` it starts a local Ray cluster (on loopback, see `service.cluster.local_ray`);
with one it deploys onto that cluster. It deploys the model groups, then serves the front
(`service.cluster.front`; gRPC on `grpc_port`: `service.cluster.front_grpc`) itself. SIGTERM
or Ctrl-C drains as one process does: the front stops accepting, lets every request in flight
finish within HOOKSERVE_SHUTDOWN_GRACE_S (503 with Retry-After past it), then Serve's
replicas stop, and the command exits 0.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from service.errors import InvalidField

log = logging.getLogger("hookserve.cluster")
DEPLOY_POLL_S = 0.5


def parse_args(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        prog="python -m service.cluster", description="hookserve on Ray Serve: replicas and model groups"
    )
    parser.add_argument("--config", type=Path, help="models TOML, with an optional [cluster] table")
    parser.add_argument("--model-dir", type=Path, help="root of every server-side path (the same on every node)")
    parser.add_argument("--device", help="auto | cpu | cuda | cuda:N | mps, in every replica")
    parser.add_argument("--host", help="HTTP and gRPC address of the front (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="HTTP port of the front (default 8000)")
    parser.add_argument("--grpc-port", help="gRPC port of the front (default 8001; off: none)")
    parser.add_argument("--address", help="an existing Ray cluster (e.g. 10.0.0.1:6379 or auto); default: start one")
    parser.add_argument(
        "--attach",
        action="store_true",
        help="serve one more front for the application already deployed (with --address); deploy nothing",
    )
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
    parser.add_argument("--router-replicas", type=int, help="replicas of the router deployment of `serve run` (2)")
    parser.add_argument("--ray-cpus", type=float, help="CPUs of the local Ray cluster this command starts")
    parser.add_argument("--ray-gpus", type=float, help="GPUs of the local Ray cluster this command starts")
    parser.add_argument("--temp-dir", type=Path, help="Ray's session files for the local cluster (default /tmp/ray)")
    args = parser.parse_args(argv)
    if args.attach and args.address is None:
        parser.error("--attach serves a front for an application on a running cluster: give its --address")
    return {k: v for k, v in vars(args).items() if v is not None and v is not False}


class Stop:
    """SIGTERM / SIGINT set an event the main thread waits on (the first one only; the drain is not cut)."""

    def __init__(self) -> None:
        self.event = threading.Event()

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if not self.event.is_set():
            log.info("signal %d: stopping", signum)
        self.event.set()

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self)
        signal.signal(signal.SIGINT, self)


def deploy(app: Any, name: str, stop: threading.Event) -> bool:
    """Deploy without HTTP and wait until it runs (True), a signal comes (False) or it fails (RuntimeError)."""
    from ray import serve

    serve.run_many(
        [serve.RunTarget(app, name=name, route_prefix=None)],
        wait_for_ingress_deployment_creation=False,
        wait_for_applications_running=False,
    )
    while not stop.wait(DEPLOY_POLL_S):
        status = serve.status().applications.get(name)
        state = str(status.status.value) if status is not None else "NOT_STARTED"
        if state == "RUNNING":
            return True
        if state in ("DEPLOY_FAILED", "UNHEALTHY"):
            raise RuntimeError(f"application {name!r} {state}: {status.message if status is not None else ''}")
    return False


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    try:
        from service.cluster.plan import make_plan

        settings, plan = make_plan(args)
    except (InvalidField, OSError) as exc:
        print(f"python -m service.cluster: {exc}", file=sys.stderr)
        return 2
    from service.cluster import local_ray

    own_cluster = "address" not in args
    local = local_ray.prepare(args.get("temp_dir"), os.environ) if own_cluster else None
    for key, value in local_ray.FRONT_ENV.items():  # read when Serve is imported
        os.environ.setdefault(key, value)
    import ray
    from ray import serve
    from ray.serve.handle import DeploymentHandle

    from service.api.shutdown import ShutdownNotice
    from service.cluster.app import groups_application, router_groups, router_settings
    from service.cluster.deployments import HandleSender, ReplicaWatch
    from service.cluster.front import front_app, serve_front
    from service.cluster.front_grpc import FrontServicer, GrpcFront
    from service.cluster.router import RouterApp

    started = ray.init(**(local_ray.init_kwargs(local, args) if local is not None else {"address": args["address"]}))
    stop = Stop()
    stop.install()  # after ray.init, which installs a SIGTERM handler of its own (sys.exit) over any earlier one
    gcs = ray.get_runtime_context().gcs_address
    dashboard = f"http://{started.dashboard_url}" if getattr(started, "dashboard_url", None) else None
    log.info("Ray at %s; its CLI: %s", gcs, local_ray.cli_hint(local, gcs, dashboard))
    app_name = plan.cluster.app_name
    attach = bool(args.get("attach"))
    deployed = False
    code = 0
    try:
        serve.start(proxy_location="Disabled")  # the front is this process; Serve runs no HTTP proxy of its own
        if not attach:
            described = ", ".join(f"{g.name} ({', '.join(g.models) or 'built-in models'})" for g in plan.groups)
            log.info(
                "deploying %s (%s layout, groups %s); the front opens once it runs",
                app_name,
                plan.cluster.layout,
                described,
            )
            deployed = True
            if not deploy(groups_application(plan), app_name, stop.event):
                return 0
        if app_name not in serve.status().applications:
            raise RuntimeError(f"no application {app_name!r} on the cluster at {gcs} to attach to")
        # handles of our own (not Serve's cached ones): their routers run on the front's loop, and close with it
        handles = {g.name: DeploymentHandle(g.deployment, app_name) for g in plan.groups}
        watch = ReplicaWatch(app_name, {g.name: g.deployment for g in plan.groups}, plan.cluster.no_replica_wait_s)
        sender = HandleSender(handles, watch)
        groups = router_groups(plan)
        grpc_front = None
        if settings.grpc_port is not None:
            servicer = FrontServicer(groups, sender.call, plan.cluster.retries)
            grpc_front = GrpcFront(servicer, settings, settings.grpc_port)

        async def on_startup() -> None:
            if grpc_front is not None:
                await grpc_front.start()

        async def on_shutdown() -> None:  # HTTP has drained: the gRPC calls in flight get the grace, then the handles
            if grpc_front is not None:
                await grpc_front.stop()
            await sender.close()

        router = RouterApp(
            groups, sender, router_settings(plan), plan.model_order, on_shutdown=on_shutdown, on_startup=on_startup
        )
        notice = ShutdownNotice()
        log.info("serving on http://%s:%d", settings.host, settings.port)
        started_front = serve_front(
            front_app(router, notice),
            notice,
            host=settings.host,
            port=settings.port,
            grace_s=settings.shutdown_grace_s,
            log_level=settings.log_level,
        )
        if not started_front:
            raise RuntimeError("the front did not start (see above)")
    except RuntimeError as exc:
        log.error("%s", exc)
        code = 1
    finally:
        log.info("front stopped; stopping %s", app_name if deployed else "the connection to Ray")
        if own_cluster:
            serve.shutdown()
        elif deployed:
            serve.delete(app_name)
        ray.shutdown()
    return code


if __name__ == "__main__":
    sys.exit(main())
