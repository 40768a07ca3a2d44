"""The Ray Serve side: `ModelGroup` (hookserve's app in each replica), the handle sender, and the `Router` deployment.

A `ModelGroup` replica builds `create_app(settings)` for its models, runs its lifespan,
and waits until every model has loaded before Serve sends it traffic; `forward` replays a
request through the app and names the replica in `X-Hookserve-Replica`.

`HandleSender` is how the router reaches a group: a DeploymentHandle call, with the wait for a
replica bounded by `ReplicaWatch` (`no_replica_wait_s`), and Ray's failures mapped onto the
router's `ReplicaLost` (retry elsewhere) and `GroupUnavailable` (503 with Retry-After).
`python -m service.cluster` runs the router in its own front (`service.cluster.front`); the
`Router` deployment hosts the same router behind Serve's HTTP proxy for Ray's own tooling
(`serve run`, `serve deploy`, KubeRay).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import grpc
import orjson
from ray import serve
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, RayTaskError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError
from ray.serve.handle import DeploymentHandle, DeploymentResponse

from service.api.headers import EveryAnswerHeadersMiddleware
from service.cluster.asgi_host import AppHost
from service.cluster.front import RequestIdMiddleware
from service.cluster.grpc_ingress import GrpcIngress, GrpcReplica
from service.cluster.messages import REPLICA_HEADER, ForwardRequest, ForwardResponse
from service.cluster.metrics_mirror import MetricsMirror
from service.cluster.router import Group, GroupUnavailable, ReplicaLost, RouterApp, RouterSettings

log = logging.getLogger("hookserve.cluster")

SETTLE_POLL_S = 0.2


class ModelGroup(GrpcReplica):
    """One replica of a model group: hookserve's whole app, in-process, for the models of its TOML.

    `peers` (the other groups' handles, unused here) only ties every group into one Serve
    application whose ingress is the first group, when no router deployment is the ingress.
    """

    host: AppHost

    async def __init__(  # type: ignore[misc]  # Serve awaits an async constructor
        self,
        group: str,
        specs_toml: str | None,
        settings: dict[str, Any],
        load_timeout_s: float = 600.0,
        metrics_interval_s: float = 5.0,
        *,
        peers: Mapping[str, DeploymentHandle] | None = None,
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
        answer.headers.append((REPLICA_HEADER.encode(), self.replica.encode()))
        return answer

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


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0] if text else type(exc).__name__


class ReplicaWatch:
    """Whether each group has a running replica, as Serve's controller says (asked every `poll_s` from a thread).

    Serve's handle waits for a replica without end; this is what bounds the wait. A request
    for a group with no running replica waits at most `wait_s` for one; a request already sent
    is given up once its group has had none for `wait_s` (its replica died and no other is
    left). While the controller cannot be asked (it is restarting), the last answer stands.
    """

    def __init__(self, app: str, deployments: Mapping[str, str], wait_s: float, poll_s: float = 0.5) -> None:
        self.app = app
        self.deployments = dict(deployments)  # group -> deployment name
        self.wait_s = wait_s
        self.poll_s = poll_s
        self._up = dict.fromkeys(self.deployments, True)
        self._back: dict[str, asyncio.Event] = {}
        self._outage: dict[str, asyncio.Future[None]] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._poller: asyncio.Task[None] | None = None

    def _running(self) -> dict[str, int] | None:
        """Running replicas per group, from the controller (None when it cannot say)."""
        try:
            status = serve.status().applications.get(self.app)
        except Exception:
            return None
        found = status.deployments if status is not None else {}
        return {
            group: int(found[name].replica_states.get("RUNNING", 0)) if name in found else 0
            for group, name in self.deployments.items()
        }

    def _start(self) -> None:
        if self._poller is None:
            loop = asyncio.get_running_loop()
            for group in self.deployments:
                self._back[group] = asyncio.Event()
                self._back[group].set()
                self._outage[group] = loop.create_future()
            self._poller = asyncio.ensure_future(self._poll())

    async def _poll(self) -> None:
        while True:
            running = await asyncio.to_thread(self._running)
            if running is not None:
                for group, count in running.items():
                    self._set(group, count > 0)
            await asyncio.sleep(self.poll_s)

    def _set(self, group: str, up: bool) -> None:
        if up == self._up[group]:
            return
        self._up[group] = up
        if up:
            self._back[group].set()
            timer = self._timers.pop(group, None)
            if timer is not None:
                timer.cancel()
            if self._outage[group].done():
                self._outage[group] = asyncio.get_running_loop().create_future()
            return
        log.warning("group %s has no running replica", group)
        self._back[group].clear()
        outage = self._outage[group]
        self._timers[group] = asyncio.get_running_loop().call_later(self.wait_s, _resolve, outage)

    async def until_up(self, group: str) -> None:
        """Returns once the group has a running replica; GroupUnavailable after `wait_s` without one."""
        self._start()
        if self._up[group]:
            return
        try:
            await asyncio.wait_for(self._back[group].wait(), self.wait_s)
        except TimeoutError:
            raise GroupUnavailable(f"it has had no running replica for {self.wait_s:g} s (no_replica_wait_s)") from None

    def outage(self, group: str) -> asyncio.Future[None]:
        """Resolves once the group has had no running replica for `wait_s`."""
        self._start()
        return self._outage[group]

    def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class HandleSender:
    """The router's `send`: a group's replicas by DeploymentHandle, the wait for a replica bounded by `watch`.

    The calls go over Serve's gRPC straight to a replica rather than as Ray actor tasks: half
    the CPU per request on both sides (bench/cluster.py). Each group's handle is made on first
    use, on the caller's event loop, where its router then runs.
    """

    def __init__(self, handles: Mapping[str, DeploymentHandle], watch: ReplicaWatch) -> None:
        self.handles = dict(handles)
        self.watch = watch
        self._methods: dict[tuple[str, str], DeploymentHandle] = {}

    def _handle(self, group: str, method: str) -> DeploymentHandle:
        handle = self._methods.get((group, method))
        if handle is None:
            handle = self.handles[group].options(method_name=method, _by_reference=False)
            self._methods[(group, method)] = handle
        return handle

    async def __call__(self, group: str, request: ForwardRequest) -> ForwardResponse:
        answer: ForwardResponse = await self.call(group, "forward", request)
        return answer

    async def call(self, group: str, method: str, *args: Any) -> Any:
        """A replica's `method(*args)`; ReplicaLost when the replica died under it, GroupUnavailable when none can
        take it within the watch's bound."""
        await self.watch.until_up(group)
        response = self._handle(group, method).remote(*args)
        answering: asyncio.Future[Any] = asyncio.ensure_future(_answer(response))
        outage = self.watch.outage(group)
        try:
            await asyncio.wait((answering, outage), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            _drop(answering, response)  # the client left or the front is shutting down: the replica drops the work
            raise
        if not answering.done():
            _drop(answering, response)
            raise GroupUnavailable(f"its replicas stopped and none came back within {self.watch.wait_s:g} s")
        try:
            return answering.result()
        except (BackPressureError, DeploymentUnavailableError) as exc:
            raise GroupUnavailable(_first_line(exc)) from None
        except grpc.aio.AioRpcError as exc:  # the replica's own errors come as answers: this is the connection
            raise ReplicaLost(f"{exc.code().name}: {exc.details()}") from None
        except Exception as exc:
            if _died(exc):
                raise ReplicaLost(_first_line(exc)) from None
            raise

    async def close(self) -> None:
        """Stop the handles' routers (on the loop they run on) and the watch."""
        self.watch.close()
        used = [h for h in self.handles.values() if h.is_initialized]
        await asyncio.gather(*(h.shutdown_async() for h in used), return_exceptions=True)


async def _answer(response: DeploymentResponse[Any]) -> Any:
    return await response


def _drop(answering: asyncio.Future[Any], response: DeploymentResponse[Any]) -> None:
    """Give up a call: its task, then Serve's request (the replica cancels its work); the outcome is not wanted."""
    answering.cancel()
    response.cancel()
    answering.add_done_callback(lambda task: task.cancelled() or task.exception())


class Router(GrpcIngress):
    """The ingress under Ray's own tooling: Serve's proxies hand it every HTTP request and gRPC call; it forwards
    to the groups.

    Serve's proxy adds `X-Request-ID` to every answer, so the router's own is left off.
    """

    def __init__(
        self,
        groups: list[tuple[str, tuple[str, ...]]],
        settings: RouterSettings,
        order: tuple[str, ...],
        handles: dict[str, DeploymentHandle],
        *,
        deployments: dict[str, str],
        no_replica_wait_s: float = 5.0,
    ) -> None:
        self.groups = [Group(name, tuple(models)) for name, models in groups]
        self.settings = settings
        self.order = order
        self.handles = handles  # for gRPC calls (GrpcIngress)
        context = serve.get_replica_context()
        watch = ReplicaWatch(context.app_name, deployments, no_replica_wait_s)
        self.sender = HandleSender(handles, watch)

    def __serve_build_asgi_app__(self) -> Any:
        router = RouterApp(self.groups, self.sender, self.settings, self.order, on_shutdown=self.sender.close)
        return EveryAnswerHeadersMiddleware(RequestIdMiddleware(router, answer_header=False))


# Serve deployments over the classes above (the classes stay importable by name for pickling).
MODEL_GROUP: Any = serve.deployment(ModelGroup)
ROUTER: Any = serve.deployment(serve.ingress()(Router))
