"""docker-compose.yml against the Compose Specification schema, and everything it names exists.

`compose-spec.json` is the Compose Specification JSON schema as vendored by docker-compose
1.29.2 (`compose/config/compose_spec.json`, Apache-2.0), copied here verbatim.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]
from jsonschema import Draft201909Validator  # type: ignore[import-untyped]

from service.api.observability import install_observability
from service.config import Settings
from service.main import create_app
from tests.deploy.conftest import HealthStub

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
INTERPOLATION = re.compile(r"\$\{([A-Z0-9_]+)(?::?-([^}]*))?\}")


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return data


def services() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = compose()["services"]
    return found


def interpolate(value: str) -> str:
    """Compose's `${VAR:-default}` with an empty environment: the default."""
    return INTERPOLATION.sub(lambda m: m[2] or "", value)


def schema_errors(document: dict[str, Any]) -> list[str]:
    schema = json.loads((Path(__file__).parent / "compose-spec.json").read_text())
    Draft201909Validator.check_schema(schema)
    return [e.message for e in Draft201909Validator(schema).iter_errors(document)]


def test_validates_against_the_compose_specification() -> None:
    assert schema_errors(compose()) == []


def test_the_schema_rejects_a_broken_file() -> None:
    broken = copy.deepcopy(compose())
    broken["services"]["hookserve-gpu"]["deploy"]["resources"]["reservations"]["devices"][0]["gpus"] = 1
    broken["services"]["hookserve"]["ports"] = 8000
    assert len(schema_errors(broken)) == 2


def test_services_and_profiles() -> None:
    profiles = {name: s.get("profiles", []) for name, s in services().items()}
    assert profiles == {"hookserve": [], "hookserve-gpu": ["gpu"], "prometheus": ["monitoring"]}


def test_gpu_variant_reserves_an_nvidia_device_and_cuda_wheels() -> None:
    gpu, cpu = services()["hookserve-gpu"], services()["hookserve"]
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    assert interpolate(gpu["build"]["args"]["TORCH_VARIANT"]).startswith("cu")
    assert cpu["build"]["args"]["TORCH_VARIANT"] == "cpu"
    assert interpolate(gpu["environment"]["HOOKSERVE_DEVICE"]) == "cuda"
    declared = set(re.findall(r"^ARG (\w+)", (ROOT / "Dockerfile").read_text(), flags=re.M))
    for service in (gpu, cpu):
        assert set(service["build"]["args"]) <= declared


def test_paths_exist() -> None:
    for name, service in services().items():
        if "build" in service:
            context = ROOT / service["build"]["context"]
            assert context.is_dir(), name
            assert (context / service["build"]["dockerfile"]).is_file(), name
        for volume in service.get("volumes", []):
            host = volume.split(":")[0]
            assert host.startswith("./"), volume
            assert (ROOT / host).exists(), volume
    prometheus = services()["prometheus"]
    (mount,) = prometheus["volumes"]
    host, target, _mode = mount.split(":")
    assert (ROOT / host).is_file()
    assert prometheus["command"] == [f"--config.file={target}"]


def test_ports_match_the_settings_and_the_dockerfile() -> None:
    """Every front (HTTP, gRPC, TorchServe management) is exposed at its default port and published by
    both services, on host ports that do not collide when every profile runs at once."""
    fronts = {
        "HOOKSERVE_PORT": Settings.model_fields["port"].default,
        "HOOKSERVE_GRPC_PORT": Settings.model_fields["grpc_port"].default,
        "HOOKSERVE_TORCHSERVE_MANAGEMENT_PORT": Settings.model_fields["torchserve_management_port"].default,
    }
    (exposed,) = re.findall(r"^EXPOSE ([\d ]+)$", (ROOT / "Dockerfile").read_text(), flags=re.M)
    assert sorted(exposed.split()) == sorted(str(port) for port in fronts.values())
    host_ports: list[str] = []
    for name in ("hookserve", "hookserve-gpu"):
        service = services()[name]
        published = dict(reversed(mapping.split(":")) for mapping in service["ports"])
        environment = {**compose()["x-hookserve-environment"], **service["environment"]}
        assert {environment[variable] for variable in fronts} == set(published)
        assert all(environment[variable] == str(port) for variable, port in fronts.items())
        host_ports.extend(published.values())
    assert len(set(host_ports)) == len(host_ports)  # all profiles at once do not collide


def test_variables_are_settings_and_load(monkeypatch: pytest.MonkeyPatch) -> None:
    text = COMPOSE.read_text()
    named = set(re.findall(r"HOOKSERVE_[A-Z0-9_]+", text))
    fields = {f"HOOKSERVE_{name.upper()}" for name in Settings.model_fields}
    assert named
    assert named <= fields, named - fields
    for name in ("hookserve", "hookserve-gpu"):
        environment = services()[name]["environment"]
        for key in list(os.environ):
            if key.startswith("HOOKSERVE_"):
                monkeypatch.delenv(key)
        for key, value in environment.items():
            monkeypatch.setenv(key, interpolate(str(value)))
        settings = Settings()
        assert (settings.host, settings.port, settings.model_dir) == ("0.0.0.0", 8000, Path("/models"))
        assert not settings.admin_token  # empty unless HOOKSERVE_ADMIN_TOKEN is given: admin calls off
        assert "HOOKSERVE_ADMIN_TOKEN" in environment
    stop = services()["hookserve"]["stop_grace_period"]
    assert float(stop.rstrip("s")) > Settings.model_fields["shutdown_grace_s"].default


def test_prometheus_scrapes_the_metrics_route() -> None:
    config = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    settings = Settings()
    app = create_app(settings)
    install_observability(app, settings)
    assert job["metrics_path"] in app.openapi()["paths"]
    targets = [t for group in job["static_configs"] for t in group["targets"]]
    assert targets == ["hookserve:8000", "hookserve-gpu:8000"]
    for target in targets:
        name, port = target.split(":")
        assert services()[name]["ports"][0].split(":")[1] == port


def test_healthcheck_probes_healthz(stub_server: ThreadingHTTPServer, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("hookserve", "hookserve-gpu"):
        test = services()[name]["healthcheck"]["test"]
        assert test[:3] == ["CMD", "python", "-c"]
        assert "http://127.0.0.1:8000/healthz" in test[3]
        code = test[3].replace(":8000/", f":{stub_server.server_address[1]}/")

        def probe(code: str = code) -> int:
            return subprocess.run([sys.executable, "-c", code], capture_output=True, check=False).returncode

        monkeypatch.setattr(HealthStub, "status", 200)
        assert probe() == 0
        monkeypatch.setattr(HealthStub, "status", 503)
        assert probe() != 0
