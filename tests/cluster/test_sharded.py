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
GRACE_S = 4
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
        yield Sharded(process.url, process.port, ref, process)
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


@pytest.mark.parametrize(
    ("method", "path", "kwargs"),
    [
        ("POST", "/predict", {"json": {"model": "nope", "inputs": []}}),
        ("POST", "/predict", {"json": {"model": "nope", "inputs": [slow_input()]}}),
        ("GET", "/models/nope", {}),
        ("POST", "/v2/models/nope/infer", {"content": b"{}"}),
        ("POST", "/predict", {"json": {"inputs": []}}),
        ("POST", "/predict", {"content": b"{oops", "headers": {"Content-Type": "application/json"}}),
        ("POST", "/predict", {"files": {"image": ("d.png", sample_png(1), "image/png")}}),
        ("POST", "/predict", {"content": b'{"model": "lenet2"}', "headers": {"Content-Type": "text/plain"}}),
    ],
)
def test_unknown_models_and_bad_bodies_are_answered_as_one_process_does(
    sharded: Sharded, method: str, path: str, kwargs: dict[str, Any]
) -> None:
    got = httpx.request(method, f"{sharded.url}{path}", timeout=60, **kwargs)
    want = sharded.ref.request(method, path, **kwargs)
    assert 400 <= got.status_code < 500, got.text
    assert (got.status_code, got.json()) == (want.status_code, want.json())


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
    from ray import serve

    assert running_replicas(APP, DIGITS) == 1
    assert running_replicas(APP, MORE) == 1
    assert "router" not in serve.status().applications[APP].deployments  # the command's front routes
    # two replicas of half a CPU each: one of the two CPUs is left
    wait_for(lambda: ray.available_resources().get("CPU") == 1.0, 60, "1 CPU left after two half-CPU replicas")


def test_another_front_attached_to_the_deployment_serves_it_and_leaves_it_running(sharded: Sharded) -> None:
    """`--attach`: a second front (e.g. on another node, behind one load balancer) routes to the same replicas;
    stopping it leaves the application and the first front serving."""
    from ray import serve

    config = sharded.process.args[sharded.process.args.index("--config") + 1]
    workdir = sharded.process.log_path.parent
    second = ClusterProcess(sharded.process.cluster, workdir, ["--attach", "--config", config]).start()
    try:
        assert second.port != sharded.port
        response = httpx.post(f"{second.url}/predict", json=tensor_body("lenet2", digits(1, seed=9)), timeout=60)
        assert response.status_code == 200, response.text
        assert replica_of(response).startswith(f"{MORE}#")
    finally:
        assert second.stop() == 0, second.log()
    assert APP in serve.status().applications
    assert httpx.get(f"{sharded.url}/readyz", timeout=30).status_code == 200


def test_sigterm_drains_then_answers_what_outlasts_the_grace_period_503_and_exits_0(sharded: Sharded) -> None:
    """Runs last in this module: it stops the deployment. A request that finishes within the grace period is
    answered 200; one still running when it ends gets the JSON 503 with Retry-After one process gives."""
    from ray import serve

    results: dict[str, Any] = {}

    def call(name: str, seconds: float) -> threading.Thread:
        body = {"model": "slow", "inputs": [slow_input(seconds, fill=0.5)], "layers": ["body"]}

        def run() -> None:
            try:
                results[name] = httpx.post(f"{sharded.url}/activations", json=body, timeout=120)
            except httpx.TransportError as exc:
                results[name] = exc

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    short = call("short", 2.0)
    wait_for(
        lambda: httpx.get(f"{sharded.url}/models/slow", timeout=10).json()["hooks"] > 0, 60, "the slow job running"
    )
    long = call("long", 120.0)  # queued behind the short one in the replica, then runs past the grace period
    time.sleep(0.5)  # it has reached the front
    process = sharded.process.process
    assert process is not None
    process.send_signal(signal.SIGTERM)
    code = process.wait(GRACE_S + 90)
    short.join(60)
    long.join(60)
    assert code == 0, sharded.process.log()
    done = results["short"]
    assert isinstance(done, httpx.Response), done
    assert done.status_code == 200, done.text
    assert done.json()["activations"]["body"]["output"]["shape"] == [1, 3]
    cut = results["long"]
    assert isinstance(cut, httpx.Response), f"the connection was dropped: {cut!r}"
    assert cut.status_code == 503, cut.text
    assert cut.headers["content-type"] == "application/json"
    assert int(cut.headers["retry-after"]) > 0
    assert "shutting down" in cut.json()["detail"]
    assert len(cut.headers.get_list("x-request-id")) == 1
    assert APP not in serve.status().applications
