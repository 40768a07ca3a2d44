"""What gets deployed: Serve options per group (replicas, autoscaling, CPUs, fractional GPUs, queue bounds)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from service.cluster.config import load_cluster_config
from service.cluster.plan import REPLICA_ENV, build_plan, make_plan
from service.config import Settings
from service.specs.model import ModelSpec, Source, parse_specs

SPECS = [
    ModelSpec(name="lenet", source=Source.python, architecture="service.zoo.lenet:LeNet", input_size=[3, 32, 32]),
    ModelSpec(name="resnet18", source=Source.torchvision, architecture="resnet18"),
    ModelSpec(name="vit", source=Source.timm, architecture="efficientvit_b0", kwargs={"features_only": True}),
]


def sharded(**overrides: object) -> dict[str, object]:
    groups = [
        {"name": "cpu", "models": ["lenet"], "num_replicas": 2},
        {"name": "gpu", "models": ["vit", "resnet18"], "num_gpus": 0.5, "min_replicas": 1, "max_replicas": 4},
    ]
    return {"layout": "sharded", "num_cpus": 1.5, "groups": groups, **overrides}


def test_max_ongoing_requests_follows_max_queue_so_serve_queues_instead_of_replicas_refusing() -> None:
    settings = Settings(max_queue=70)
    plan = build_plan(load_cluster_config(None, {}, sharded()), SPECS, settings)
    for group in plan.groups:
        assert group.options["max_ongoing_requests"] == 70
        assert group.options["max_queued_requests"] == 70
    # the router deployment (two replicas by default) holds what every group's replicas take: 70 x (2 + 4) / 2
    assert plan.router_options["num_replicas"] == 2
    assert plan.router_options["max_ongoing_requests"] == 210
    assert plan.router_options["ray_actor_options"]["num_cpus"] == 0
    assert plan.cluster.no_replica_wait_s == 5.0


def test_replicas_autoscaling_and_fractional_gpus_per_group() -> None:
    plan = build_plan(load_cluster_config(None, {}, sharded()), SPECS, Settings())
    cpu, gpu = plan.groups
    assert (cpu.deployment, cpu.models) == ("group-cpu", ("lenet",))
    assert cpu.options["num_replicas"] == 2
    assert cpu.options["ray_actor_options"] == {"num_cpus": 1.5, "runtime_env": {"env_vars": REPLICA_ENV}}
    assert "autoscaling_config" not in cpu.options
    assert gpu.models == ("resnet18", "vit")  # in the TOML's order
    assert gpu.options["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 4}
    assert "num_replicas" not in gpu.options
    assert {k: v for k, v in gpu.options["ray_actor_options"].items() if k != "runtime_env"} == {
        "num_cpus": 1.5,
        "num_gpus": 0.5,
    }
    assert plan.model_order == ("lenet", "resnet18", "vit")


def test_each_group_serves_exactly_its_models() -> None:
    plan = build_plan(load_cluster_config(None, {}, sharded()), SPECS, Settings())
    for group in plan.groups:
        assert group.specs_toml is not None
        served = parse_specs(tomllib.loads(group.specs_toml))
        assert [s.name for s in served] == list(group.models)
        assert served == [s for s in SPECS if s.name in group.models]


def test_threads_follow_num_cpus_unless_set() -> None:
    plan = build_plan(load_cluster_config(None, {}, {"num_cpus": 3.7}), None, Settings())
    assert plan.groups[0].settings["torch_threads"] == plan.groups[0].settings["decode_threads"] == 3
    plan = build_plan(load_cluster_config(None, {}, {"num_cpus": 0.5}), None, Settings(torch_threads=2))
    assert plan.groups[0].settings["cpu_threads"] == 1
    assert plan.groups[0].settings["torch_threads"] == 2  # an explicit setting wins


def test_replicas_get_explicit_settings_but_not_the_servers_own_file_and_port(tmp_path: Path) -> None:
    (tmp_path / "m.toml").write_text('[[models]]\nname = "lenet"\nsource = "python"\narchitecture = "x:Y"\n')
    settings, plan = make_plan(
        {"config": tmp_path / "m.toml", "model_dir": tmp_path, "port": 9000, "replicas": 3},
        environ={},
    )
    (group,) = plan.groups
    assert group.settings["model_dir"] == str(tmp_path)
    assert {"config", "port", "host"}.isdisjoint(group.settings)
    assert group.options["num_replicas"] == 3
    assert group.specs_toml is not None
    assert 'name = "lenet"' in group.specs_toml.replace('"name"', "name")
    assert settings.port == 9000


def test_the_replicated_layout_serves_the_built_in_registry_without_a_toml() -> None:
    plan = build_plan(load_cluster_config(None, {}, {}), None, Settings())
    (group,) = plan.groups
    assert (group.name, group.models, group.specs_toml) == ("models", (), None)
    assert group.options["num_replicas"] == 1
    assert group.options["ray_actor_options"]["num_cpus"] == 1.0
    assert "num_gpus" not in group.options["ray_actor_options"]


def test_groups_from_flags_mean_sharded(tmp_path: Path) -> None:
    toml = "".join(f'[[models]]\nname = "{n}"\nsource = "torchvision"\narchitecture = "resnet18"\n' for n in "ab")
    (tmp_path / "m.toml").write_text(toml)
    _, plan = make_plan({"config": tmp_path / "m.toml", "groups": ["one=a", "two=b"], "num_gpus": 0.5}, environ={})
    assert plan.cluster.layout == "sharded"
    assert [(g.name, g.models, g.options["ray_actor_options"]["num_gpus"]) for g in plan.groups] == [
        ("one", ("a",), 0.5),
        ("two", ("b",), 0.5),
    ]
