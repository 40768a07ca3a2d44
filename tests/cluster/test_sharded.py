"""The sharded layout, deployed by `python -m service.cluster` onto the session's Ray cluster.

Two groups, each its own deployment with half a CPU per replica: `digits` (lenet) and
`more` (lenet2, slow). The router sends every request to its model's group, whether the
model is named in the path, a query parameter, a JSON body or a multipart form; `/models`,
`/readyz` and `/v2/repository/index` answer for both groups. SIGTERM drains: the request in
flight finishes, the command exits 0 and the application is gone.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from tests.cluster.api_checks import (
    check_activations,
    check_predict,
    check_saliency,
    check_v2,
    digits,
    reference_client,
    replica_of,
    tensor_body,
)
from tests.cluster.conftest import ClusterProcess, RayCluster, running_replicas, wait_for
from tests.conftest import sample_png, write_lenet
from tests.reliability.live_server import slow_input, write_slow

APP = "sharded"
GRACE_S = 20
CLUSTER_TABLE = f"""
[cluster]
layout = "sharded"
num_cpus = 0.5
app_name = "{APP}"
metrics_interval_s = 0

[[cluster.groups]]
name = "digits"
models = ["lenet"]

[[cluster.groups]]
name = "more"
models = ["lenet2", "slow"]
"""
DIGITS, MORE = "group-digits", "group-more"


@dataclass
class Sharded:
    url: str
    port: int
    ref: TestClient
    process: ClusterProcess


@pytest.fixture(scope="module")
def sharded(ray_cluster: RayCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sharded]:
    from ray import serve

    model_dir = tmp_path_factory.mktemp("sharded")
    config = model_dir / "models.toml"
    config.write_text(write_lenet(model_dir) + write_lenet(model_dir, "lenet2") + write_slow(model_dir) + CLUSTER_TABLE)
    process = ClusterProcess(
        ray_cluster,
        model_dir,
        ["--config", str(config), "--model-dir", str(model_dir)],
        env={"HOOKSERVE_SHUTDOWN_GRACE_S": str(GRACE_S)},
    )
    ref = reference_client(model_dir, config)
    try:
        process.start()
        yield Sharded(ray_cluster.url, ray_cluster.port, ref, process)
    finally:
        ref.__exit__(None, None, None)
        process.stop()
        if APP in serve.status().applications:
            serve.delete(APP)


def test_each_model_is_served_by_its_group(sharded: Sharded) -> None:
    check_predict(sharded.url, sharded.ref, "lenet", DIGITS)
    check_activations(sharded.url, sharded.ref, "lenet", DIGITS)
    check_saliency(sharded.url, sharded.ref, "lenet", DIGITS)
    check_predict(sharded.url, sharded.ref, "lenet2", MORE)
    check_activations(sharded.url, sharded.ref, "lenet2", MORE)


def test_v2_through_tritonclient(sharded: Sharded) -> None:
    check_v2(sharded.port, sharded.ref, "lenet2")
    check_v2(sharded.port, sharded.ref, "lenet")


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "group"),
    [
        ("GET", "/models/lenet2", {}, MORE),
        ("GET", "/models/lenet/layers", {}, DIGITS),
        ("GET", "/models/slow/summary?depth=1", {}, MORE),
        ("GET", "/v2/models/lenet/ready", {}, DIGITS),
        ("GET", "/v2/models/lenet2", {}, MORE),
        (
            "POST",
            "/predict",
            {
                "json": {
                    "model": "lenet2",
                    "inputs": [{"tensor": {"shape": [3, 32, 32], "dtype": "float32", "data": [0.0] * 3072}}],
                }
            },
            MORE,
        ),
        (
            "POST",
            "/predict",
            {"data": {"model": "lenet"}, "files": {"image": ("d.png", sample_png(3), "image/png")}},
            DIGITS,
        ),
        (
            "POST",
            "/gradients",
            {"data": {"model": "lenet2", "layers": "conv1"}, "files": {"image": ("d.png", sample_png(3), "image/png")}},
            MORE,
        ),
        ("POST", "/checkpoints/inspect?compare_to=lenet2", {"json": {"path": "lenet_digits.pt"}}, MORE),
    ],
)
def test_routing_by_path_query_json_and_multipart(
    sharded: Sharded, method: str, path: str, kwargs: dict[str, Any], group: str
) -> None:
    response = httpx.request(method, f"{sharded.url}{path}", timeout=60, **kwargs)
    assert response.status_code == 200, response.text
    assert replica_of(response).startswith(f"{group}#")


def test_unknown_models_and_bad_bodies_are_4xx(sharded: Sharded) -> None:
    url = sharded.url
    unknown = httpx.post(f"{url}/predict", json={"model": "nope", "inputs": []})
    assert unknown.status_code == 404
    assert "nope" in unknown.json()["detail"]
    assert httpx.get(f"{url}/models/nope").status_code == 404
    v2 = httpx.post(f"{url}/v2/models/nope/infer", content=b"{}")
    assert v2.status_code == 404
    assert "error" in v2.json()
    assert httpx.post(f"{url}/predict", json={"inputs": []}).status_code == 422  # no model: any group says why
    bad = httpx.post(f"{url}/predict", content=b"{oops", headers={"Content-Type": "application/json"})
    assert bad.status_code == 400
    form = httpx.post(f"{url}/predict", files={"image": ("d.png", sample_png(1), "image/png")})
    assert form.status_code == 422


def test_the_model_list_and_readiness_cover_every_group(sharded: Sharded) -> None:
    url = sharded.url
    listed = httpx.get(f"{url}/models")
    assert listed.status_code == 200
    assert [m["name"] for m in listed.json()["models"]] == ["lenet", "lenet2", "slow"]
    assert {name.split("#")[0] for name in replica_of(listed).split(", ")} == {DIGITS, MORE}
    ready = httpx.get(f"{url}/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready", "models": {}}
    index = httpx.post(f"{url}/v2/repository/index", json={})
    assert index.status_code == 200
    assert [(m["name"], m["state"]) for m in index.json()] == [
        ("lenet", "READY"),
        ("lenet2", "READY"),
        ("slow", "READY"),
    ]
    assert httpx.get(f"{url}/v2/health/ready").json() == {"ready": True}
    assert httpx.get(f"{url}/v2/health/live").json() == {"live": True}


def test_groups_are_separate_deployments_with_fractional_cpus(sharded: Sharded) -> None:
    import ray

    assert running_replicas(APP, DIGITS) == 1
    assert running_replicas(APP, MORE) == 1
    assert running_replicas(APP, "router") == 1
    # two replicas of half a CPU each, the router none: one of the two CPUs is left
    wait_for(lambda: ray.available_resources().get("CPU") == 1.0, 60, "1 CPU left after two half-CPU replicas")


def test_sigterm_drains_the_request_in_flight_then_exits_0(sharded: Sharded) -> None:
    """Runs last in this module: it stops the deployment."""
    from ray import serve

    body = {"model": "slow", "inputs": [slow_input(3.0, fill=0.5)], "layers": ["body"]}
    result: dict[str, Any] = {}

    def call() -> None:
        try:
            result["response"] = httpx.post(f"{sharded.url}/activations", json=body, timeout=120)
        except httpx.TransportError as exc:
            result["error"] = exc

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    wait_for(
        lambda: httpx.get(f"{sharded.url}/models/slow", timeout=10).json()["hooks"] > 0, 60, "the slow job running"
    )
    process = sharded.process.process
    assert process is not None
    signalled = time.monotonic()
    process.send_signal(signal.SIGTERM)
    code = process.wait(GRACE_S + 60)
    elapsed = time.monotonic() - signalled
    thread.join(60)
    assert code == 0, sharded.process.log()
    assert "error" not in result, result
    response: httpx.Response = result["response"]
    assert response.status_code == 200, response.text
    assert response.json()["activations"]["body"]["output"]["shape"] == [1, 3]
    assert elapsed < GRACE_S + 30, f"took {elapsed:.1f} s"
    assert APP not in serve.status().applications
    after = httpx.post(f"{sharded.url}/predict", json=tensor_body("lenet", digits(1, seed=0)), timeout=30)
    assert after.status_code in (404, 503)
