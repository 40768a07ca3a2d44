"""The Serve application: settings and cluster config in, the router bound to one deployment per group out.

`build` is also an application builder for Ray's own CLI and Serve config files:

    serve run service.cluster.app:build config=models.toml model_dir=./models layout=sharded
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ray import serve

from service.cluster.config import load_cluster_config, parse_group
from service.cluster.deployments import MODEL_GROUP, ROUTER
from service.cluster.plan import ClusterPlan, build_plan
from service.cluster.router import RouterSettings
from service.config import Settings
from service.specs.model import load_specs

ROUTER_DEPLOYMENT = "router"
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


def application(plan: ClusterPlan) -> serve.Application:
    """The router bound to a `ModelGroup` deployment per group."""
    handles = {
        group.name: MODEL_GROUP.options(name=group.deployment, **group.options).bind(
            group.name,
            group.specs_toml,
            group.settings,
            plan.cluster.load_timeout_s,
            plan.cluster.metrics_interval_s,
        )
        for group in plan.groups
    }
    router_settings = RouterSettings(
        admin_token=plan.admin_token,
        max_body_bytes=plan.max_body_bytes,
        max_upload_bytes=plan.max_upload_bytes,
        retries=plan.cluster.retries,
        retry_after_s=plan.cluster.retry_after_s,
    )
    groups = [(g.name, g.models) for g in plan.groups]
    router = ROUTER.options(name=ROUTER_DEPLOYMENT, **plan.router_options)
    app: serve.Application = router.bind(groups, router_settings, plan.model_order, handles)
    return app


def build(args: dict[str, str]) -> serve.Application:
    """Application builder for `serve run` / `serve deploy`: the same keys as the flags (`groups` split by ';')."""
    _, plan = make_plan(args)
    return application(plan)
