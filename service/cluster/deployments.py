"""The two Ray Serve deployments: `ModelGroup` (hookserve's app in each replica) and `Router` (the HTTP ingress).

A `ModelGroup` replica builds `create_app(settings)` for its models, runs its lifespan,
and waits until every model has loaded before Serve sends it traffic; `forward` replays a
request through the app and names the replica in `X-Hookserve-Replica`. The `Router` is
the only deployment Serve's proxy talks to; it forwards by DeploymentHandle and turns a
dead replica into a retry or a 503 (see `service.cluster.router`).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
from ray import serve
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, RayTaskError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError
from ray.serve.handle import DeploymentHandle

from service.cluster.asgi_host import AppHost
from service.cluster.grpc_ingress import GrpcIngress, GrpcReplica
from service.cluster.messages import REPLICA_HEADER, ForwardRequest, ForwardResponse
from service.cluster.metrics_mirror import MetricsMirror
from service.cluster.router import Group, GroupUnavailable, ReplicaLost, RouterApp, RouterSettings

log = logging.getLogger("hookserve.cluster")

SETTLE_POLL_S = 0.2


class ModelGroup(GrpcReplica):
    """One replica of a model group: hookserve's whole app, in-process, for the models of its TOML."""

    async def __init__(  # type: ignore[misc]  # Serve awaits an async constructor
        self,
        group: str,
        specs_toml: str | None,
        settings: dict[str, Any],
        load_timeout_s: float = 600.0,
        metrics_interval_s: float = 5.0,
    ) -> None:
        from service import openmp_env

        openmp_env.apply()  # before service.main brings in torch (and libgomp)
        from service.config import Settings
        from service.main import create_app

        context = serve.get_replica_context()
        self.group = group
        self.replica = f"{context.deployment}#{context.replica_id.unique_id}"
        self._workdir = Path(tempfile.mkdtemp(prefix="hookserve-replica-"))
        config = None
        if specs_toml is not None:
            config = self._workdir / "models.toml"
            config.write_text(specs_toml)
        fronts_off = {"grpc_port": None, "torchserve_management_port": None}  # Serve's proxies are the cluster's
        self.host = AppHost(create_app(Settings(**{**settings, "config": config, **fronts_off})))
        await self.host.start()
        await self._wait_settled(load_timeout_s)
        self._mirror_task: asyncio.Task[None] | None = None
        if metrics_interval_s > 0:
            self._mirror_task = asyncio.create_task(self._mirror_metrics(metrics_interval_s))

    async def _wait_settled(self, timeout: float) -> None:
        """Until no model is loading: Serve routes to this replica only once its constructor returns."""
        deadline = time.monotonic() + timeout
        while True:
            answer = await self.host.call(ForwardRequest("GET", "/models"))
            models = orjson.loads(answer.body).get("models", []) if answer.status == 200 else []
            if answer.status == 200 and all(m.get("status") != "loading" for m in models):
                failed = [m["name"] for m in models if m.get("status") == "failed"]
                if failed:
                    log.error("replica %s: models failed to load: %s (see GET /readyz)", self.replica, failed)
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"replica {self.replica}: models still loading after {timeout:g} s")
            await asyncio.sleep(SETTLE_POLL_S)

    async def _mirror_metrics(self, interval: float) -> None:
        mirror = MetricsMirror()
        while True:
            try:
                answer = await self.host.call(ForwardRequest("GET", "/metrics"))
                if answer.status == 200:
                    await asyncio.to_thread(mirror.update, answer.body.decode("utf-8"))
            except Exception:
                log.exception("replica %s: could not copy its metrics into Ray's export", self.replica)
            await asyncio.sleep(interval)

    async def forward(self, request: ForwardRequest) -> ForwardResponse:
        """One request through the app; the answer names this replica."""
        answer = await self.host.call(request)
        headers = [*answer.headers, (REPLICA_HEADER.encode(), self.replica.encode())]
        return ForwardResponse(answer.status, headers, answer.body)

    async def check_health(self) -> None:
        """Serve restarts a replica whose app stopped on its own."""
        if not self.host.running:
            raise RuntimeError(f"replica {self.replica}: the app stopped ({self.host.error or 'no error given'})")

    async def __del__(self) -> None:
        """Serve's graceful stop: in-flight requests have drained; release the models, then the files."""
        task = getattr(self, "_mirror_task", None)
        if task is not None:
            task.cancel()
        host: AppHost | None = getattr(self, "host", None)
        if host is not None:
            await host.stop()
        workdir = getattr(self, "_workdir", None)
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)


def _died(exc: BaseException) -> bool:
    """Whether an error means the replica is gone (the request itself did not fail)."""
    if isinstance(exc, (ActorDiedError, ActorUnavailableError, RayActorError)):
        return True
    cause = getattr(exc, "cause", None)
    return isinstance(exc, RayTaskError) and isinstance(cause, (ActorDiedError, ActorUnavailableError, RayActorError))


class Router(GrpcIngress):
    """The ingress: Serve's proxy hands it every HTTP request; it forwards to the model groups."""

    def __init__(
        self,
        groups: list[tuple[str, tuple[str, ...]]],
        settings: RouterSettings,
        order: tuple[str, ...],
        handles: dict[str, DeploymentHandle],
    ) -> None:
        self.groups = [Group(name, tuple(models)) for name, models in groups]
        self.settings = settings
        self.order = order
        self.handles = handles

    def __serve_build_asgi_app__(self) -> RouterApp:
        return RouterApp(self.groups, self._send, self.settings, self.order)

    async def _send(self, group: str, request: ForwardRequest) -> ForwardResponse:
        try:
            response: ForwardResponse = await self.handles[group].forward.remote(request)
        except (BackPressureError, DeploymentUnavailableError) as exc:
            raise GroupUnavailable(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
        except Exception as exc:
            if _died(exc):
                raise ReplicaLost(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
            raise
        return response


# Serve deployments over the classes above (the classes stay importable by name for pickling).
MODEL_GROUP: Any = serve.deployment(ModelGroup)
ROUTER: Any = serve.deployment(serve.ingress()(Router))
