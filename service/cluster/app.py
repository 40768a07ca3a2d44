"""The Serve applications made from a plan: one `ModelGroup` deployment per group.

`groups_application` is what `python -m service.cluster` deploys: the groups alone, without
HTTP, since its own front routes and reaches them by handle. `application` puts the router
deployment first, behind Serve's HTTP proxy; `build` makes it for Ray's own CLI and Serve
config files:

    serve run service.cluster.app:build config=models.toml model_dir=./models layout=sharded
"""

from __future__ import annotations

from typing import Any

from ray import serve

from service.cluster.deployments import MODEL_GROUP, ROUTER
from service.cluster.plan import ClusterPlan, GroupPlan, make_plan
from service.cluster.router import Group, RouterSettings

ROUTER_DEPLOYMENT = "router"


def _bind(plan: ClusterPlan, group: GroupPlan, peers: dict[str, Any] | None = None) -> Any:
    """The `ModelGroup` deployment of one group, bound to its arguments."""
    extra = {"peers": peers} if peers else {}
    options = MODEL_GROUP.options(name=group.deployment, **group.options)
    cluster = plan.cluster
    return options.bind(
        group.name, group.specs_toml, group.settings, cluster.load_timeout_s, cluster.metrics_interval_s, **extra
    )


def router_settings(plan: ClusterPlan) -> RouterSettings:
    return RouterSettings(
        admin_token=plan.admin_token,
        max_body_bytes=plan.max_body_bytes,
        max_upload_bytes=plan.max_upload_bytes,
        retries=plan.cluster.retries,
        retry_after_s=plan.cluster.retry_after_s,
    )


def router_groups(plan: ClusterPlan) -> list[Group]:
    return [Group(g.name, g.models) for g in plan.groups]


def groups_application(plan: ClusterPlan) -> serve.Application:
    """Every group as one Serve application without HTTP, for `python -m service.cluster`, whose front routes.

    The first group is the ingress; it takes the others as (unused) arguments so that Serve
    deploys them with it, as one application.
    """
    first, *rest = plan.groups
    app: serve.Application = _bind(plan, first, {g.name: _bind(plan, g) for g in rest})
    return app


def application(plan: ClusterPlan) -> serve.Application:
    """The router deployment bound to a `ModelGroup` deployment per group, behind Serve's proxy (Ray's tooling)."""
    groups = [(g.name, g.models) for g in plan.groups]
    handles = {g.name: _bind(plan, g) for g in plan.groups}
    router = ROUTER.options(name=ROUTER_DEPLOYMENT, **plan.router_options)
    deployments = {g.name: g.deployment for g in plan.groups}
    app: serve.Application = router.bind(
        groups,
        router_settings(plan),
        plan.model_order,
        handles,
        deployments=deployments,
        no_replica_wait_s=plan.cluster.no_replica_wait_s,
    )
    return app


def build(args: dict[str, str]) -> serve.Application:
    """Application builder for `serve run` / `serve deploy`: the same keys as the flags (`groups` split by ';')."""
    _, plan = make_plan(args)
    return application(plan)
