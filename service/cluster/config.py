"""Cluster settings: the models TOML's `[cluster]` table, `HOOKSERVE_CLUSTER_*` env and flags (flags win).

```toml
[cluster]
layout = "sharded"          # replicated (N copies of every model) | sharded (model groups)
num_cpus = 1                # defaults for every group
[[cluster.groups]]
name = "digits"
models = ["lenet"]
num_replicas = 2
[[cluster.groups]]
name = "vision"
models = ["resnet18"]
num_gpus = 0.5              # two replicas share one GPU
min_replicas = 1            # autoscaling bounds instead of num_replicas
max_replicas = 4
```

No Ray here: the single-process server ignores the `[cluster]` table, and these checks run
before anything is deployed.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from service.errors import InvalidField
from service.specs.model import ModelSpec

ENV_PREFIX = "HOOKSERVE_CLUSTER_"
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,47}$"  # Serve deployment names may not hold "#"


class Layout(StrEnum):
    replicated = "replicated"  # every replica serves every model
    sharded = "sharded"  # each group of models is its own deployment with its own replicas


class Scaling(BaseModel):
    """How many replicas and what each one takes from the cluster; unset fields inherit."""

    model_config = ConfigDict(extra="forbid")

    num_replicas: int | None = Field(None, ge=1, le=1024, description="Fixed replica count.")
    min_replicas: int | None = Field(None, ge=0, le=1024, description="Autoscaling lower bound.")
    max_replicas: int | None = Field(None, ge=1, le=1024, description="Autoscaling upper bound.")
    target_ongoing_requests: float | None = Field(
        None, gt=0, description="Autoscaling target of requests in flight per replica (Serve's default 2)."
    )
    num_cpus: float | None = Field(None, ge=0, le=1024, description="CPUs reserved per replica (fractions allowed).")
    num_gpus: float | None = Field(None, ge=0, le=64, description="GPUs per replica; 0.5 puts two on one GPU.")

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        autoscaled = self.min_replicas is not None or self.max_replicas is not None
        if self.num_replicas is not None and autoscaled:
            raise ValueError("give num_replicas or min_replicas/max_replicas (autoscaling), not both")
        if self.min_replicas is not None and self.max_replicas is not None and self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas ({self.min_replicas}) is above max_replicas ({self.max_replicas})")
        return self


class GroupConfig(Scaling):
    """`[[cluster.groups]]`: models served together by one deployment."""

    name: str = Field(..., pattern=NAME_PATTERN)
    models: list[str] = Field(..., min_length=1)


class ClusterConfig(Scaling):
    """Everything about the cluster that is not a model or a per-process setting."""

    layout: Layout = Layout.replicated
    app_name: str = Field("hookserve", pattern=NAME_PATTERN, description="The Serve application's name.")
    router_replicas: int = Field(
        2, ge=1, le=256, description="Replicas of the router deployment that Ray's own tooling (serve run) puts first."
    )
    retries: int = Field(2, ge=0, le=5, description="Retries of a request whose replica died under it.")
    retry_after_s: int = Field(1, ge=0, le=3600, description="Retry-After of a 503 when no replica could answer.")
    no_replica_wait_s: float = Field(
        5.0, gt=0, le=3600, description="How long a request waits for a replica of its group before a 503."
    )
    load_timeout_s: float = Field(600.0, gt=0, description="How long a new replica may take to load its models.")
    metrics_interval_s: float = Field(5.0, ge=0, description="Replica metrics into Ray's export every N s; 0 = off.")
    groups: list[GroupConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _groups_fit_layout(self) -> Self:
        names = [g.name for g in self.groups]
        if len(set(names)) != len(names):
            raise ValueError(f"group names must be unique: {names}")
        if self.layout is Layout.replicated and self.groups:
            raise ValueError('[[cluster.groups]] are for layout = "sharded"')
        if self.layout is Layout.sharded and not self.groups:
            raise ValueError('layout = "sharded" needs [[cluster.groups]] (or --group NAME=MODEL,...)')
        return self


SCALAR_FIELDS = tuple(name for name in ClusterConfig.model_fields if name != "groups")


def _describe(exc: ValidationError) -> str:
    return "; ".join(
        (".".join(map(str, e["loc"])) + ": " if e["loc"] else "") + e["msg"] for e in exc.errors(include_url=False)
    )


def env_values(environ: Mapping[str, str]) -> dict[str, str]:
    """The `HOOKSERVE_CLUSTER_<FIELD>` variables that are set (groups come from the TOML or flags only)."""
    out: dict[str, str] = {}
    for name in SCALAR_FIELDS:
        value = environ.get(ENV_PREFIX + name.upper())
        if value is not None and value != "":
            out[name] = value
    return out


def parse_group(text: str) -> dict[str, Any]:
    """`--group NAME=MODEL,MODEL`: a group with the cluster-wide resources."""
    name, sep, models = text.partition("=")
    found = [m.strip() for m in models.split(",") if m.strip()]
    if not sep or not re.match(NAME_PATTERN, name.strip()) or not found:
        raise InvalidField(f"--group {text!r}: expected NAME=MODEL[,MODEL...]")
    return {"name": name.strip(), "models": found}


def read_table(config: Path | None) -> dict[str, Any]:
    """The `[cluster]` table of a models TOML ({} without a file or a table)."""
    if config is None:
        return {}
    with config.open("rb") as f:
        table = tomllib.load(f).get("cluster", {})
    if not isinstance(table, dict):
        raise InvalidField("models config: [cluster] must be a table")
    return table


def load_cluster_config(
    config: Path | None, environ: Mapping[str, str], overrides: Mapping[str, Any] | None = None
) -> ClusterConfig:
    """Merge TOML < env < flags (`overrides`, None values ignored) and validate."""
    values: dict[str, Any] = dict(read_table(config))
    values.update(env_values(environ))
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        return ClusterConfig.model_validate(values)
    except ValidationError as exc:
        raise InvalidField(f"cluster config: {_describe(exc)}") from None


def check_models(cluster: ClusterConfig, specs: list[ModelSpec] | None) -> None:
    """Every model in exactly one group, every grouped model configured; `specs` None = the built-in registry."""
    if cluster.layout is Layout.replicated:
        return
    if specs is None:
        raise InvalidField(
            'cluster config: layout = "sharded" needs a models TOML (--config): each group serves models named there'
        )
    known = [s.name for s in specs]
    owner: dict[str, str] = {}
    for group in cluster.groups:
        for model in group.models:
            if model not in known:
                raise InvalidField(
                    f"cluster config: group {group.name!r} names {model!r}, not in the models TOML {known}"
                )
            if model in owner:
                raise InvalidField(f"cluster config: model {model!r} is in groups {owner[model]!r} and {group.name!r}")
            owner[model] = group.name
    missing = [name for name in known if name not in owner]
    if missing:
        raise InvalidField(f"cluster config: models in no group: {missing}; add them to a [[cluster.groups]] entry")
