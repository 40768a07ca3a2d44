"""deploy/kserve/inferenceservice.yaml against what KServe requires of a custom v2 predictor, and against the app.

The rules are KServe's own (v1beta1 InferenceService, its admission checks): the name
format, one container named `kserve-container`, `PROTOCOL=v2`, one port (named http1 for
REST), probes on that port, a known GPU resource with requests equal to limits, replica
bounds, and an HPA metric and target KServe accepts. The paths and flags must exist in
hookserve: the probes' paths are in `create_app`'s OpenAPI schema, the args parse as `python -m service`'s.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

import service.__main__ as entry
from service.main import create_app

MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "kserve" / "inferenceservice.yaml"
NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")  # KServe's InferenceService name format (and DNS-1035)
GPU_TYPES = {"nvidia.com/gpu", "amd.com/gpu", "intel.com/gpu"}
QUANTITY = re.compile(r"^\d+(\.\d+)?(m|Ki|Mi|Gi|Ti|k|M|G|T)?$")


@pytest.fixture(scope="module")
def isvc() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(MANIFEST.read_text())
    return data


@pytest.fixture(scope="module")
def container(isvc: dict[str, Any]) -> dict[str, Any]:
    containers = isvc["spec"]["predictor"]["containers"]
    assert len(containers) == 1, "a custom predictor here is one container"
    found: dict[str, Any] = containers[0]
    return found


def test_resource_identity(isvc: dict[str, Any]) -> None:
    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1"
    assert isvc["kind"] == "InferenceService"
    name = isvc["metadata"]["name"]
    assert NAME.match(name)
    assert len(name) <= 63
    assert set(isvc["spec"]) <= {"predictor", "transformer", "explainer"}
    assert "predictor" in isvc["spec"]


def test_autoscaling_is_hpa_with_bounds_kserve_accepts(isvc: dict[str, Any]) -> None:
    annotations = isvc["metadata"]["annotations"]
    assert annotations["serving.kserve.io/deploymentMode"] in {"Standard", "RawDeployment"}
    assert annotations["serving.kserve.io/autoscalerClass"] in {"hpa", "external", "keda", "none"}
    predictor = isvc["spec"]["predictor"]
    low, high = predictor["minReplicas"], predictor["maxReplicas"]
    assert isinstance(low, int)
    assert isinstance(high, int)
    assert 0 <= low <= high
    assert high >= 1
    if annotations["serving.kserve.io/autoscalerClass"] == "hpa":
        assert predictor["scaleMetric"] in {"cpu", "memory"}
        if predictor["scaleMetric"] == "cpu":
            assert 1 <= predictor["scaleTarget"] <= 100


def test_the_container_is_kserves_and_speaks_v2(container: dict[str, Any]) -> None:
    assert container["name"] == "kserve-container"
    assert container["image"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["PROTOCOL"] == "v2"
    assert env["STORAGE_URI"].startswith(("pvc://", "s3://", "gs://", "hdfs://", "oci://", "https://"))


def test_one_port_and_the_server_listens_on_it(container: dict[str, Any]) -> None:
    (port,) = container["ports"]
    assert port["name"] in {"http1", "h2c"}  # http1: REST
    assert port["protocol"] == "TCP"
    number = port["containerPort"]
    assert isinstance(number, int)
    assert 1 <= number <= 65535
    assert container["command"] == ["python", "-m", "service"]
    flags = entry.parse_args(container["args"])  # the flags exist in `python -m service`
    assert flags["port"] == number
    assert flags["host"] == "0.0.0.0"
    assert str(flags["config"]).startswith(str(flags["model_dir"]))
    assert str(flags["model_dir"]) == "/mnt/models"  # where KServe's storage initializer mounts STORAGE_URI


def test_probes_hit_v2_health_routes_of_the_app(container: dict[str, Any]) -> None:
    routes = set(create_app().openapi()["paths"])
    port = container["ports"][0]["containerPort"]
    expected = {"livenessProbe": "/v2/health/live", "readinessProbe": "/v2/health/ready", "startupProbe": None}
    for probe, path in expected.items():
        get = container[probe]["httpGet"]
        assert get["port"] == port
        assert get["path"] in routes
        if path is not None:
            assert get["path"] == path


def test_gpu_and_other_resources(container: dict[str, Any]) -> None:
    requests, limits = container["resources"]["requests"], container["resources"]["limits"]
    gpus = GPU_TYPES & (set(requests) | set(limits))
    assert gpus, "no GPU resource"
    for gpu in gpus:
        assert str(limits[gpu]).isdigit()
        assert int(limits[gpu]) >= 1
        assert requests.get(gpu, limits[gpu]) == limits[gpu]  # Kubernetes: requests equal limits
    for resources in (requests, limits):
        for value in resources.values():
            assert QUANTITY.match(str(value)), value
    assert "cpu" in requests  # the HPA's cpu target is a percentage of the request
