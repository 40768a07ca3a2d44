"""What to deploy: one plan per model group (Serve deployment options, models TOML text) and the router's.

Pure data, no Ray: `make_plan` reads the flags, env and TOML into a plan before Ray is
started, `service.cluster.app` turns the plan into Serve deployments, and tests check the
options (replicas, resources, queue bounds) without a cluster.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from service.cluster.config import ClusterConfig, Layout, Scaling, check_models, load_cluster_config, parse_group
from service.cluster.spec_toml import specs_toml
from service.config import Settings
from service.specs.model import ModelSpec, load_specs

REPLICATED_GROUP = "models"  # the one group of the replicated layout
THREAD_FIELDS = ("worker_threads", "cpu_threads", "torch_threads", "decode_threads")
NOT_FOR_REPLICAS = ("config", "host", "port")  # the replica gets its own TOML; the front owns the port
REPLICA_FIELDS = {"num_replicas", "min_replicas", "max_replicas", "target_ongoing_requests"}
# Serve writes an access-log line per call to each replica's log file; the app logs every request already
QUIET_REPLICA = {"enable_access_log": False}
# Serve's own per-request overhead, halved (measured in bench/cluster.py): a replica runs its calls on its own event
# loop rather than handing each to a second thread, and a handle's router runs on the caller's loop
REPLICA_ENV = {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0"}
ROUTER_ENV = {**REPLICA_ENV, "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0"}


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
    actor: dict[str, Any] = {"num_cpus": num_cpus, "runtime_env": {"env_vars": REPLICA_ENV}}
    if scaling.num_gpus:
        actor["num_gpus"] = scaling.num_gpus
    options: dict[str, Any] = {
        "ray_actor_options": actor,
        "max_ongoing_requests": settings.max_queue,
        "max_queued_requests": settings.max_queue,
        "graceful_shutdown_timeout_s": settings.shutdown_grace_s,
        "graceful_shutdown_wait_loop_s": 0.5,
        "logging_config": QUIET_REPLICA,
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
        "ray_actor_options": {"num_cpus": 0, "runtime_env": {"env_vars": ROUTER_ENV}},
        "max_ongoing_requests": max(100, math.ceil(capacity / cluster.router_replicas)),
        "graceful_shutdown_timeout_s": settings.shutdown_grace_s,
        "graceful_shutdown_wait_loop_s": 0.5,
        "logging_config": QUIET_REPLICA,
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


SETTINGS_ARGS = ("config", "model_dir", "device", "host", "port", "grpc_port")
CLUSTER_ARGS = {
    "layout": "layout",
    "replicas": "num_replicas",
    "min_replicas": "min_replicas",
    "max_replicas": "max_replicas",
    "target_ongoing_requests": "target_ongoing_requests",
    "num_cpus": "num_cpus",
    "num_gpus": "num_gpus",
    "app_name": "app_name",
    "router_replicas": "router_replicas",
}


def make_plan(args: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> tuple[Settings, ClusterPlan]:
    """Settings (flags over `HOOKSERVE_*`), the cluster config (flags over env over TOML), checked into a plan."""
    environ = os.environ if environ is None else environ
    settings = Settings(**{k: args[k] for k in SETTINGS_ARGS if args.get(k) is not None})
    overrides: dict[str, Any] = {field: args.get(arg) for arg, field in CLUSTER_ARGS.items()}
    groups = args.get("groups")
    if isinstance(groups, str):
        groups = [g for g in groups.split(";") if g.strip()]
    if groups:
        overrides["groups"] = [parse_group(g) for g in groups]
        overrides["layout"] = overrides.get("layout") or "sharded"
    config = Path(settings.config) if settings.config is not None else None
    cluster = load_cluster_config(config, environ, overrides)
    specs = load_specs(config) if config is not None else None
    return settings, build_plan(cluster, specs, settings)
