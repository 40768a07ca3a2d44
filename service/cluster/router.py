"""The router in front of the model groups: one ASGI app, served by the cluster's front (or a Serve deployment).

It reads the request, picks the group that serves its model (sharded) or the one group
(replicated), and forwards it through `send`. A body names its model the way the app reads
it (`service.cluster.routing`); a request naming no model, or one no group serves, goes to
any group, whose app answers exactly as one process would (400, 404, 422). It answers for the
whole cluster where one replica could not: `/models`, `/readyz`, `/v2/health/ready` and
`/v2/repository/index` ask every group. A replica that dies under a request costs the client
nothing when a retry on another replica succeeds (every forwarded call is a read), else a 503
with Retry-After; never a 500. A client that leaves before its answer cancels the call.
Admin load/unload is refused with a 409: the model set is the Serve config.

No Ray here: `send` raises `ReplicaLost` or `GroupUnavailable`, and
`service.cluster.deployments` maps Ray's exceptions onto them.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.types import Message, Receive, Scope, Send

from service.api.bodies import is_multipart
from service.cluster.messages import REPLICA_HEADER, ForwardRequest, ForwardResponse
from service.cluster.routing import is_admin, model_of
from service.errors import unknown_model

log = logging.getLogger("hookserve.cluster")

UPLOAD_PATHS = ("/checkpoints/inspect",)  # multipart uploads there may use max_upload_bytes, as in service.main
PARSE_IN_THREAD = 1024 * 1024  # bodies larger than this are searched for their model off the event loop
MODEL_SET_IS_CONFIG = (
    "the model set of a Ray Serve cluster is its Serve config: a model loaded here would reach one replica "
    "only and be missing from every replica Serve starts later. Add or remove the model in the models TOML "
    "(and its [[cluster.groups]] entry) and deploy again with `python -m service.cluster --config ...` "
    "(or `serve deploy`); Serve replaces the replicas one by one without downtime"
)
METRICS_ELSEWHERE = (
    "in a cluster each replica exports its metrics through Ray's metrics export (ray_hookserve_* series "
    "labelled with deployment and replica): scrape every node's Ray metrics port, see docs/cluster.md"
)


class ReplicaLost(Exception):
    """The replica died (or became unreachable) while it held the request: safe to retry elsewhere."""


class GroupUnavailable(Exception):
    """No replica can take the request now (none running, or the group's queue is full)."""


Sender = Callable[[str, ForwardRequest], Awaitable[ForwardResponse]]
Headers = Sequence[tuple[bytes, bytes]]


@dataclass(frozen=True)
class Group:
    """A model group as the router sees it: its name and the models it serves (empty = all)."""

    name: str
    models: tuple[str, ...]


@dataclass(frozen=True)
class RouterSettings:
    admin_token: str | None
    max_body_bytes: int
    max_upload_bytes: int
    retries: int = 1
    retry_after_s: int = 1


class _Disconnected(Exception):
    """The client left before its body was read: nothing to forward, nobody to answer."""


async def _disconnect(receive: Receive) -> None:
    """Returns once the client has gone (after the body, the server sends only `http.disconnect`)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class _TooLarge(Exception):
    def __init__(self, limit: int, name: str) -> None:
        super().__init__(f"request body over the {limit}-byte limit ({name})")


def _error_body(path: str, message: str) -> bytes:
    return orjson.dumps({"error": message} if path.startswith("/v2") else {"detail": message})


def json_response(status: int, content: Any, headers: Headers = ()) -> ForwardResponse:
    body = orjson.dumps(content)
    base = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    return ForwardResponse(status, [*base, *headers], body)


def error_response(
    path: str, status: int, message: str, headers: Sequence[tuple[bytes, bytes]] = ()
) -> ForwardResponse:
    body = _error_body(path, message)
    base = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    return ForwardResponse(status, [*base, *headers], body)


class RouterApp:
    """The ASGI app of the router deployment."""

    def __init__(
        self,
        groups: Sequence[Group],
        send: Sender,
        settings: RouterSettings,
        order: Sequence[str] = (),
        *,
        on_shutdown: Callable[[], Awaitable[None]] | None = None,
        on_startup: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        """`on_startup`, `on_shutdown`: awaited at the lifespan's startup and shutdown, on the server's loop (to
        start what serves beside it, and release what `send` holds)."""
        if not groups:
            raise ValueError("the router needs at least one group")
        self.groups = tuple(groups)
        self.send = send
        self.settings = settings
        self.owner = {model: g.name for g in self.groups for model in g.models}
        self.order = {name: i for i, name in enumerate(order or self.owner)}
        self.on_shutdown = on_shutdown
        self.on_startup = on_startup

    # ---- ASGI --------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        try:
            request = await self._read(scope, receive)
        except _TooLarge as exc:
            await self._respond(send, error_response(scope["path"], 413, str(exc)))
            return
        except _Disconnected:
            return
        answer = await self._unless_gone(self.handle(request), receive)
        if answer is not None:
            await self._respond(send, answer)

    @staticmethod
    async def _unless_gone(work: Awaitable[ForwardResponse], receive: Receive) -> ForwardResponse | None:
        """The answer; None (the call cancelled) when the client disconnects first."""
        answering = asyncio.ensure_future(work)
        leaving = asyncio.ensure_future(_disconnect(receive))
        try:
            await asyncio.wait((answering, leaving), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (answering, leaving):
                if not task.done():
                    task.cancel()
        if answering.done() and not answering.cancelled():
            return answering.result()
        return None

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    if self.on_startup is not None:
                        await self.on_startup()
                except Exception as exc:  # e.g. the gRPC port is taken: the server does not start
                    await send({"type": "lifespan.startup.failed", "message": f"{type(exc).__name__}: {exc}"})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.on_shutdown is not None:
                    await self.on_shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _limit(self, path: str, headers: list[tuple[bytes, bytes]]) -> tuple[int, str]:
        if path.startswith(UPLOAD_PATHS) and is_multipart(dict(headers).get(b"content-type")):
            return self.settings.max_upload_bytes, "max_upload_bytes"
        return self.settings.max_body_bytes, "max_body_bytes"

    async def _read(self, scope: Scope, receive: Receive) -> ForwardRequest:
        headers = [(bytes(k).lower(), bytes(v)) for k, v in scope.get("headers", [])]
        path: str = scope["path"]
        limit, name = self._limit(path, headers)
        length = dict(headers).get(b"content-length", b"")
        if length.isdigit() and int(length) > limit:
            raise _TooLarge(limit, name)
        chunks: list[bytes] = []
        size = 0
        while True:
            message: Message = await receive()
            if message["type"] == "http.disconnect":
                raise _Disconnected
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise _TooLarge(limit, name)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        client = scope.get("client")
        return ForwardRequest(
            method=scope["method"],
            path=path,
            query_string=scope.get("query_string", b""),
            headers=headers,
            body=b"".join(chunks),
            client=(str(client[0]), int(client[1])) if client else None,
            scheme=scope.get("scheme", "http"),
            http_version=scope.get("http_version", "1.1"),
        )

    async def _respond(self, send: Send, response: ForwardResponse) -> None:
        await send({"type": "http.response.start", "status": response.status, "headers": response.headers})
        await send({"type": "http.response.body", "body": response.body})

    # ---- routing -----------------------------------------------------------------------------

    async def handle(self, request: ForwardRequest) -> ForwardResponse:
        """Answer one request: locally, from every group, or from the group of its model."""
        method, path = request.method, request.path
        if is_admin(method, path):
            return self._refuse_admin(request)
        if method == "GET" and path == "/healthz":
            return json_response(200, {"status": "ok"})
        if method == "GET" and path == "/v2/health/live":
            return json_response(200, {"live": True})
        if method == "GET" and path == "/metrics":
            return error_response(path, 404, METRICS_ELSEWHERE)
        if len(self.groups) > 1:
            if method == "GET" and path == "/readyz":
                return await self._readyz()
            if method == "GET" and path == "/models":
                return await self._models(request)
            if method == "GET" and path == "/v2/health/ready":
                return await self._v2_ready(request)
            if method == "POST" and path == "/v2/repository/index":
                return await self._repository_index(request)
        if len(self.groups) == 1:
            return await self.forward(self.groups[0].name, request)
        if len(request.body) > PARSE_IN_THREAD:
            model = await asyncio.to_thread(model_of, request)
        else:
            model = model_of(request)
        if model is None or model in self.owner:
            return await self.forward(self.owner[model] if model is not None else self.groups[0].name, request)
        # a model no group serves: the first group's app answers as one process would (400/422 for the body
        # first, else 404), and its 404 names the closest model of the whole cluster, not of that group alone
        return self._unknown_model(model, await self.forward(self.groups[0].name, request))

    def _unknown_model(self, model: str, answer: ForwardResponse) -> ForwardResponse:
        """The group's 404 for `model` with its message as one process serving every group's models words it."""
        if answer.status != 404:
            return answer
        try:
            content = orjson.loads(answer.body)
        except orjson.JSONDecodeError:
            return answer
        said = f"no model named {model!r};"
        fields = (
            [k for k, v in content.items() if isinstance(v, str) and v.startswith(said)]
            if isinstance(content, dict)
            else []
        )
        if not fields:
            return answer
        content |= {k: str(unknown_model(model, self.owner)) for k in fields}
        kept = [(k, v) for k, v in answer.headers if k.lower() not in (b"content-length", b"content-type")]
        return json_response(404, content, kept)

    def _refuse_admin(self, request: ForwardRequest) -> ForwardResponse:
        """The token first, as in one process (nobody learns anything without it), then the 409."""
        token = self.settings.admin_token
        path = request.path
        if not token:
            return error_response(path, 403, "admin calls are disabled: no HOOKSERVE_ADMIN_TOKEN is configured")
        scheme, _, given = (request.header(b"authorization") or b"").decode("latin-1").partition(" ")
        challenge = [(b"www-authenticate", b"Bearer")]
        if scheme.lower() != "bearer" or not given:
            return error_response(path, 401, "admin call needs 'Authorization: Bearer <token>'", challenge)
        if not hmac.compare_digest(given.strip().encode(), token.encode()):
            return error_response(path, 401, "wrong admin token", challenge)
        return error_response(path, 409, MODEL_SET_IS_CONFIG)

    def _unavailable(self, path: str, message: str) -> ForwardResponse:
        retry = [(b"retry-after", str(self.settings.retry_after_s).encode())]
        return error_response(path, 503, message, retry)

    async def _attempt(self, group: str, request: ForwardRequest) -> ForwardResponse | str:
        """A replica's answer, or why no replica gave one; retried on another when the replica died under it."""
        reason = f"the replica of group {group!r} serving the request stopped; retry"
        for attempt in range(1, self.settings.retries + 2):
            try:
                return await self.send(group, request)
            except ReplicaLost as exc:
                log.warning(
                    "group %s lost a replica under %s %s (try %d): %s",
                    group,
                    request.method,
                    request.path,
                    attempt,
                    exc,
                )
            except GroupUnavailable as exc:
                return f"no replica of group {group!r} can take the request now: {exc}"
        return reason

    async def forward(self, group: str, request: ForwardRequest) -> ForwardResponse:
        """Send to a replica of `group`: its answer, or 503 with Retry-After when none could give one."""
        answer = await self._attempt(group, request)
        return self._unavailable(request.path, answer) if isinstance(answer, str) else answer

    async def _each(self, request: ForwardRequest) -> list[ForwardResponse | None]:
        """The request answered by one replica of every group (None where no replica could answer)."""

        async def one(group: Group) -> ForwardResponse | None:
            answer = await self._attempt(group.name, request)
            return None if isinstance(answer, str) else answer

        return list(await asyncio.gather(*(one(g) for g in self.groups)))

    @staticmethod
    def _replicas(answers: Sequence[ForwardResponse | None]) -> list[tuple[bytes, bytes]]:
        names = [a.header(REPLICA_HEADER.encode()) for a in answers if a is not None]
        return [(REPLICA_HEADER.encode(), b", ".join(n for n in names if n))]

    def _sorted(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return sorted(items, key=lambda item: self.order.get(str(item.get("name")), len(self.order)))

    async def _readyz(self) -> ForwardResponse:
        request = ForwardRequest("GET", "/readyz")
        answers = await self._each(request)
        not_ready: dict[str, Any] = {}
        draining = False
        for group, answer in zip(self.groups, answers, strict=True):
            if answer is None:
                not_ready.update(
                    {
                        m: {"status": "unavailable", "error": f"group {group.name!r} has no replica"}
                        for m in group.models
                    }
                )
                continue
            body = orjson.loads(answer.body)
            not_ready.update(body.get("models", {}))
            draining = draining or body.get("status") == "draining"
        if not_ready or draining:
            status = "draining" if draining else "not ready"
            return json_response(503, {"status": status, "models": not_ready}, self._replicas(answers))
        return json_response(200, {"status": "ready", "models": {}}, self._replicas(answers))

    async def _models(self, request: ForwardRequest) -> ForwardResponse:
        answers = await self._each(request)
        models: list[dict[str, Any]] = []
        for group, answer in zip(self.groups, answers, strict=True):
            if answer is None:
                return self._unavailable(request.path, f"group {group.name!r} has no replica to list its models")
            if answer.status != 200:
                return answer
            models.extend(orjson.loads(answer.body)["models"])
        return json_response(200, {"models": self._sorted(models)}, self._replicas(answers))

    async def _v2_ready(self, request: ForwardRequest) -> ForwardResponse:
        answers = await self._each(request)
        errors = []
        for group, answer in zip(self.groups, answers, strict=True):
            if answer is None:
                errors.append(f"group {group.name!r} has no replica")
            elif answer.status != 200:
                errors.append(str(orjson.loads(answer.body).get("error", answer.status)))
        if errors:
            return json_response(400, {"error": "; ".join(errors)}, self._replicas(answers))
        return json_response(200, {"ready": True}, self._replicas(answers))

    async def _repository_index(self, request: ForwardRequest) -> ForwardResponse:
        answers = await self._each(request)
        index: list[dict[str, Any]] = []
        for group, answer in zip(self.groups, answers, strict=True):
            if answer is None:
                return self._unavailable(request.path, f"group {group.name!r} has no replica to index its models")
            if answer.status != 200:
                return answer
            index.extend(orjson.loads(answer.body))
        return json_response(200, self._sorted(index), self._replicas(answers))
