"""What to deploy: one plan per model group (Serve deployment options, models TOML text) and the router's.

Pure data, no Ray: `service.cluster.app` turns the plans into Serve deployments, and tests
check the options (replicas, resources, queue bounds) without a cluster.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from service.cluster.config import ClusterConfig, Layout, Scaling, check_models
from service.cluster.spec_toml import specs_toml
from service.config import Settings
from service.specs.model import ModelSpec

REPLICATED_GROUP = "models"  # the one group of the replicated layout
THREAD_FIELDS = ("worker_threads", "cpu_threads", "torch_threads", "decode_threads")
NOT_FOR_REPLICAS = ("config", "host", "port")
REPLICA_FIELDS = {
    "num_replicas",
    "min_replicas",
    "max_replicas",
    "target_ongoing_requests",
}  # the replica gets its own TOML; Serve's proxy owns the port


@dataclass(frozen=True)
class GroupPlan:
    """One model group: its Serve deployment and what each of its replicas serves."""

    name: str
    models: tuple[str, ...]  # in the models TOML's order; empty = the built-in registry
    specs_toml: str | None  # the models TOML each replica serves; None = the built-in registry
    settings: dict[str, Any]  # Settings fields for each replica (JSON-shaped)
    options: dict[str, Any]  # keyword arguments of Serve's Deployment.options()

    @property
    def deployment(self) -> str:
        return f"group-{self.name}"

    @property
    def max_replicas(self) -> int:
        auto = self.options.get("autoscaling_config")
        return int(auto["max_replicas"]) if auto else int(self.options["num_replicas"])


@dataclass(frozen=True)
class ClusterPlan:
    """Every group, the router's deployment options and the settings the router enforces itself."""

    cluster: ClusterConfig
    groups: tuple[GroupPlan, ...]
    router_options: dict[str, Any]
    admin_token: str | None
    max_body_bytes: int
    max_upload_bytes: int
    model_order: tuple[str, ...] = field(default=())  # every model in TOML order (sharded)


def merged(group: Scaling, cluster: Scaling) -> Scaling:
    """A group's scaling with the cluster-wide values filling what it leaves unset."""
    fields = set(Scaling.model_fields)
    own = group.model_dump(include=fields, exclude_none=True)
    if REPLICA_FIELDS & own.keys():  # a group's replica choice is whole, not mixed with the cluster's
        fields -= REPLICA_FIELDS
    base = cluster.model_dump(include=fields, exclude_none=True)
    return Scaling.model_validate({**base, **own})


def threads_for(num_cpus: float) -> int:
    """Torch and decode threads of a replica that reserves `num_cpus` CPUs (at least one)."""
    return max(1, math.floor(num_cpus))


def replica_settings(settings: Settings, threads: int) -> dict[str, Any]:
    """The fields set explicitly (flags, env) for every replica; thread counts follow num_cpus unless set."""
    explicit = settings.model_dump(mode="json", include=settings.model_fields_set - set(NOT_FOR_REPLICAS))
    return {**dict.fromkeys(THREAD_FIELDS, threads), **explicit}


def deployment_options(scaling: Scaling, settings: Settings) -> dict[str, Any]:
    """Serve options of a group: replicas or autoscaling bounds, resources, and queues sized from max_queue.

    `max_ongoing_requests = max_queue`: a replica never holds more requests than one model's
    queue takes, so Serve keeps the excess in its own queue instead of a replica answering
    503 "queue full"; `max_queued_requests` bounds that queue (503 with Retry-After past it).
    """
    num_cpus = 1.0 if scaling.num_cpus is None else scaling.num_cpus
    actor: dict[str, Any] = {"num_cpus": num_cpus}
    if scaling.num_gpus:
        actor["num_gpus"] = scaling.num_gpus
    options: dict[str, Any] = {
        "ray_actor_options": actor,
        "max_ongoing_requests": settings.max_queue,
        "max_queued_requests": settings.max_queue,
        "graceful_shutdown_timeout_s": settings.shutdown_grace_s,
        "graceful_shutdown_wait_loop_s": 0.5,
    }
    if scaling.min_replicas is not None or scaling.max_replicas is not None:
        low = scaling.min_replicas if scaling.min_replicas is not None else 1
        auto: dict[str, Any] = {"min_replicas": low, "max_replicas": scaling.max_replicas or max(low, 1)}
        if scaling.target_ongoing_requests is not None:
            auto["target_ongoing_requests"] = scaling.target_ongoing_requests
        options["autoscaling_config"] = auto
    else:
        options["num_replicas"] = scaling.num_replicas or 1
    return options


def build_plan(cluster: ClusterConfig, specs: list[ModelSpec] | None, settings: Settings) -> ClusterPlan:
    """Check the groups against the models and work out every deployment."""
    check_models(cluster, specs)
    groups: list[GroupPlan] = []
    if cluster.layout is Layout.replicated:
        scaling = merged(Scaling(), cluster)
        text = None if specs is None else specs_toml(specs)
        names = () if specs is None else tuple(s.name for s in specs)
        threads = threads_for(1.0 if scaling.num_cpus is None else scaling.num_cpus)
        options = deployment_options(scaling, settings)
        groups.append(GroupPlan(REPLICATED_GROUP, names, text, replica_settings(settings, threads), options))
    else:
        assert specs is not None  # check_models refuses sharding the built-in registry
        by_name = {s.name: s for s in specs}
        order = [s.name for s in specs]
        for group in cluster.groups:
            scaling = merged(group, cluster)
            members = sorted(group.models, key=order.index)
            threads = threads_for(1.0 if scaling.num_cpus is None else scaling.num_cpus)
            groups.append(
                GroupPlan(
                    group.name,
                    tuple(members),
                    specs_toml(by_name[m] for m in members),
                    replica_settings(settings, threads),
                    deployment_options(scaling, settings),
                )
            )
    capacity = sum(settings.max_queue * g.max_replicas for g in groups)
    router_options = {
        "num_replicas": cluster.router_replicas,
        "ray_actor_options": {"num_cpus": 0},
        "max_ongoing_requests": max(100, math.ceil(capacity / cluster.router_replicas)),
        "graceful_shutdown_timeout_s": settings.shutdown_grace_s,
        "graceful_shutdown_wait_loop_s": 0.5,
    }
    order_all = () if specs is None else tuple(s.name for s in specs)
    return ClusterPlan(
        cluster,
        tuple(groups),
        router_options,
        settings.admin_token,
        settings.max_body_bytes,
        settings.max_upload_bytes,
        order_all,
    )
