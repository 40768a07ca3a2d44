"""docs/cluster.md says only what exists: its flags, env names, TOML example and Serve config are checked."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml  # type: ignore[import-untyped]

from service.cluster.__main__ import parse_args
from service.cluster.config import ENV_PREFIX, SCALAR_FIELDS, check_models, load_cluster_config
from service.specs.model import parse_specs

DOC = Path(__file__).resolve().parents[2] / "docs" / "cluster.md"


@pytest.fixture(scope="module")
def text() -> str:
    return DOC.read_text()


def blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.DOTALL)


def test_every_flag_in_the_docs_exists(text: str) -> None:
    flags = set(re.findall(r"(--[a-z][a-z-]+)", text))
    others = {"--head", "--metrics-export-port", "--build-arg"}  # ray start's and docker build's
    others |= {"--duration", "--requests", "--idle-wait", "--quick", "--write-docs", "--json"}  # bench.cluster
    argv = {"--group": ["a=b"], "--layout": ["sharded"], "--attach": ["--address", "auto"]}
    for flag in sorted(flags - others):  # an unknown flag makes argparse exit, failing the test
        args = [flag, *argv.get(flag, ["1"])]
        assert parse_args(args), f"{flag} is not a flag of python -m service.cluster"


def test_every_env_name_in_the_docs_is_a_setting(text: str) -> None:
    names = set(re.findall(rf"{ENV_PREFIX}([A-Z_]+)", text))
    fields = {f.upper() for f in SCALAR_FIELDS}
    shorthand = {"_MAX_REPLICAS"}  # written as "HOOKSERVE_CLUSTER_MIN_REPLICAS, `_MAX_REPLICAS`"
    assert names - shorthand <= fields, sorted(names - fields)


def test_the_toml_example_is_a_valid_sharded_config(text: str, tmp_path: Path) -> None:
    (example,) = [b for b in blocks(text, "toml") if "[cluster]" in b]
    (tmp_path / "models.toml").write_text(example)
    cluster = load_cluster_config(tmp_path / "models.toml", {})
    check_models(cluster, parse_specs(tomllib.loads(example)))
    assert [g.name for g in cluster.groups] == ["digits", "vision"]


def test_the_serve_config_names_the_builder(text: str) -> None:
    (config,) = [yaml.safe_load(b) for b in blocks(text, "yaml") if "applications" in b]
    (app,) = config["applications"]
    module, _, name = app["import_path"].partition(":")
    assert (module, name) == ("service.cluster.app", "build")
    assert set(app["args"]) <= {"config", "model_dir", "device", "layout", "replicas", "groups", "num_cpus"}
