"""The cluster config: TOML < env < flags, layouts and groups checked against the models before deploying."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.cluster.config import ClusterConfig, Layout, check_models, load_cluster_config, parse_group
from service.errors import InvalidField
from service.specs.model import ModelSpec, Source

SHARDED = """
[[models]]
name = "a"
source = "torchvision"
architecture = "resnet18"

[[models]]
name = "b"
source = "torchvision"
architecture = "resnet18"

[cluster]
layout = "sharded"
num_cpus = 2
[[cluster.groups]]
name = "small"
models = ["a"]
num_replicas = 2
[[cluster.groups]]
name = "big"
models = ["b"]
num_gpus = 0.5
min_replicas = 1
max_replicas = 4
"""


def spec(name: str) -> ModelSpec:
    return ModelSpec(name=name, source=Source.torchvision, architecture="resnet18")


def test_the_toml_table_is_read(tmp_path: Path) -> None:
    (tmp_path / "m.toml").write_text(SHARDED)
    cluster = load_cluster_config(tmp_path / "m.toml", {})
    assert cluster.layout is Layout.sharded
    assert cluster.num_cpus == 2
    assert [(g.name, g.models, g.num_gpus, g.max_replicas) for g in cluster.groups] == [
        ("small", ["a"], None, None),
        ("big", ["b"], 0.5, 4),
    ]
    check_models(cluster, [spec("a"), spec("b")])


def test_env_overrides_the_toml_and_flags_override_env(tmp_path: Path) -> None:
    (tmp_path / "m.toml").write_text("[cluster]\nnum_replicas = 2\nnum_cpus = 1\n")
    env = {"HOOKSERVE_CLUSTER_NUM_REPLICAS": "3", "HOOKSERVE_CLUSTER_NUM_GPUS": "0.25"}
    cluster = load_cluster_config(tmp_path / "m.toml", env, {"num_cpus": 4.0, "num_replicas": None})
    assert (cluster.num_replicas, cluster.num_cpus, cluster.num_gpus) == (3, 4.0, 0.25)


def test_no_file_means_defaults() -> None:
    cluster = load_cluster_config(None, {})
    assert cluster == ClusterConfig()
    assert cluster.layout is Layout.replicated


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"num_replicas": 2, "max_replicas": 4}, "not both"),
        ({"min_replicas": 5, "max_replicas": 2}, "above max_replicas"),
        ({"num_gpus": -1}, "num_gpus"),
        ({"layout": "sharded"}, "needs [[cluster.groups]]"),
        ({"groups": [{"name": "g", "models": ["a"]}]}, 'layout = "sharded"'),
        ({"layout": "sharded", "groups": [{"name": "g", "models": ["a"]}, {"name": "g", "models": ["b"]}]}, "unique"),
        ({"layout": "sharded", "groups": [{"name": "bad#name", "models": ["a"]}]}, "groups.0.name"),
        ({"layout": "mesh"}, "layout"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_bad_configs_are_refused_with_a_reason(values: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidField, match="cluster config") as info:
        load_cluster_config(None, {}, values)
    assert message in str(info.value)


def test_bad_env_values_are_refused() -> None:
    with pytest.raises(InvalidField, match="num_replicas"):
        load_cluster_config(None, {"HOOKSERVE_CLUSTER_NUM_REPLICAS": "many"})


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        ([{"name": "g", "models": ["a", "zzz"]}], "'zzz', not in the models TOML"),
        ([{"name": "g", "models": ["a"]}, {"name": "h", "models": ["a", "b"]}], "in groups 'g' and 'h'"),
        ([{"name": "g", "models": ["a"]}], "models in no group: ['b']"),
    ],
)
def test_groups_must_cover_the_models_once(groups: list[dict[str, object]], message: str) -> None:
    cluster = load_cluster_config(None, {}, {"layout": "sharded", "groups": groups})
    with pytest.raises(InvalidField) as info:
        check_models(cluster, [spec("a"), spec("b")])
    assert message in str(info.value)


def test_sharding_needs_a_models_toml() -> None:
    cluster = load_cluster_config(None, {}, {"layout": "sharded", "groups": [{"name": "g", "models": ["lenet"]}]})
    with pytest.raises(InvalidField, match="needs a models TOML"):
        check_models(cluster, None)


def test_group_flags() -> None:
    assert parse_group("small=lenet, resnet18") == {"name": "small", "models": ["lenet", "resnet18"]}
    for bad in ("small", "small=", "=lenet", "bad#name=lenet"):
        with pytest.raises(InvalidField, match="NAME=MODEL"):
            parse_group(bad)


def test_the_single_process_server_ignores_the_cluster_table(tmp_path: Path) -> None:
    from service.specs.model import load_specs

    (tmp_path / "m.toml").write_text(SHARDED)
    assert [s.name for s in load_specs(tmp_path / "m.toml")] == ["a", "b"]
