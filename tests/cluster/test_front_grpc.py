"""The front's gRPC routing without Ray: a call whose replica died is retried, and no replica is UNAVAILABLE."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from service.cluster.front_grpc import FrontServicer
from service.cluster.grpc_ingress import GrpcAnswer
from service.cluster.router import Group, GroupUnavailable, ReplicaLost
from service.codecs.protos import inference_pb2 as pb

GROUPS = [Group("digits", ("lenet",)), Group("more", ("lenet2",))]
READY = GrpcAnswer("OK", "", pb.ModelReadyResponse(ready=True).SerializeToString())


class Context:
    """What the routing asks of grpc.aio's servicer context."""

    def __init__(self) -> None:
        self.code: grpc.StatusCode | None = None
        self.details = ""

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", "Bearer t"),)

    def set_code(self, code: grpc.StatusCode) -> None:
        self.code = code

    def set_details(self, details: str) -> None:
        self.details = details

    def set_trailing_metadata(self, metadata: Any) -> None:
        pass


class Replicas:
    """Fails the first calls with the given errors, then answers ready."""

    def __init__(self, *failures: Exception) -> None:
        self.failures = list(failures)
        self.calls: list[tuple[Any, ...]] = []

    async def call(self, group: str, method: str, *args: Any) -> GrpcAnswer:
        self.calls.append((group, method, *args))
        if self.failures:
            raise self.failures.pop(0)
        return READY


def ask(replicas: Replicas, model: str = "lenet2", retries: int = 2) -> tuple[Any, Context]:
    servicer = FrontServicer(GROUPS, replicas.call, retries)
    context = Context()
    request = pb.ModelReadyRequest(name=model)
    answer = asyncio.run(servicer.ModelReady(request, context))  # type: ignore[attr-defined]
    return answer, context


def test_a_call_goes_to_its_models_group_with_the_callers_token() -> None:
    replicas = Replicas()
    answer, context = ask(replicas)
    assert answer.ready
    assert context.code is None
    ((group, method, rpc, _, authorization),) = replicas.calls
    assert (group, method, rpc, authorization) == ("more", "grpc", "ModelReady", "Bearer t")


def test_a_call_whose_replica_died_is_retried_on_another() -> None:
    replicas = Replicas(ReplicaLost("actor died"), ReplicaLost("actor died"))
    answer, context = ask(replicas, retries=2)
    assert answer.ready
    assert context.code is None
    assert len(replicas.calls) == 3


def test_past_its_retries_or_with_no_replica_the_call_is_unavailable() -> None:
    lost = Replicas(*(ReplicaLost("actor died") for _ in range(3)))
    _, context = ask(lost, retries=1)
    assert context.code == grpc.StatusCode.UNAVAILABLE
    assert "stopped under the call" in context.details
    assert len(lost.calls) == 2
    none = Replicas(GroupUnavailable("it has had no running replica for 1 s (no_replica_wait_s)"))
    _, context = ask(none, model="lenet")
    assert context.code == grpc.StatusCode.UNAVAILABLE
    assert "no_replica_wait_s" in context.details
    assert len(none.calls) == 1  # no retry: the wait was already bounded
