"""The replicated layout on a local Ray cluster: two replicas of the whole app behind the router.

The API answers as one process does, requests spread over both replicas (the header says
which answered), admin load/unload is a 409, each replica's metrics reach Ray's export,
and a replica killed by PID under load is replaced while no client sees a 500.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest
from fastapi.testclient import TestClient

from service.cluster.app import application, make_plan
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
from tests.cluster.conftest import RayCluster, replica_pids, running_replicas, wait_for, wait_ready
from tests.conftest import write_lenet
from tests.reliability.live_server import slow_input, write_slow

APP = "replicated"
DEPLOYMENT = "group-models"
ADMIN = "cluster-s3cret"
CLUSTER_TABLE = f"""
[cluster]
layout = "replicated"
num_replicas = 2
num_cpus = 1
app_name = "{APP}"
metrics_interval_s = 1
"""


@dataclass
class Deployed:
    url: str
    port: int
    ref: TestClient
    cluster: RayCluster


@pytest.fixture(scope="module")
def replicated(ray_cluster: RayCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployed]:
    from ray import serve

    model_dir = tmp_path_factory.mktemp("replicated")
    config = model_dir / "models.toml"
    config.write_text(write_lenet(model_dir) + write_slow(model_dir) + CLUSTER_TABLE)
    saved = os.environ.get("HOOKSERVE_ADMIN_TOKEN")
    os.environ["HOOKSERVE_ADMIN_TOKEN"] = ADMIN  # read by Settings on the driver, passed on to every replica
    try:
        _, plan = make_plan({"config": config, "model_dir": model_dir}, environ={})
    finally:
        if saved is None:
            os.environ.pop("HOOKSERVE_ADMIN_TOKEN", None)
        else:
            os.environ["HOOKSERVE_ADMIN_TOKEN"] = saved
    serve.run(application(plan), name=APP, route_prefix="/", blocking=False)
    ref = reference_client(model_dir, config)
    try:
        wait_ready(ray_cluster.url)
        yield Deployed(ray_cluster.url, ray_cluster.port, ref, ray_cluster)
    finally:
        ref.__exit__(None, None, None)
        serve.delete(APP)


def test_the_api_answers_as_one_process_does(replicated: Deployed) -> None:
    check_predict(replicated.url, replicated.ref, "lenet", DEPLOYMENT)
    check_activations(replicated.url, replicated.ref, "lenet", DEPLOYMENT)
    check_saliency(replicated.url, replicated.ref, "lenet", DEPLOYMENT)


def test_v2_through_tritonclient(replicated: Deployed) -> None:
    check_v2(replicated.port, replicated.ref, "lenet")


def test_grpc_through_serves_grpc_proxy(replicated: Deployed) -> None:
    """tritonclient.grpc, unchanged, against Serve's gRPC proxy: answers as the single process does."""
    import tritonclient.grpc as tgrpc
    from tritonclient.utils import InferenceServerException

    client = tgrpc.InferenceServerClient(f"127.0.0.1:{replicated.cluster.grpc_port}")
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("lenet")
    assert client.get_model_metadata("lenet", as_json=True)["name"] == "lenet"
    x = digits(2, seed=5)
    tensor = tgrpc.InferInput("input__0", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    outputs = [tgrpc.InferRequestedOutput("output__0", class_count=3), tgrpc.InferRequestedOutput("conv1")]
    got = client.infer("lenet", [tensor], outputs=outputs)
    expected = replicated.ref.post(
        "/v2/models/lenet/infer",
        json={
            "inputs": [{"name": "input__0", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}],
            "outputs": [{"name": "output__0", "parameters": {"classification": 3}}],
        },
    ).json()
    top = [v.decode().split(":") for v in got.as_numpy("output__0").ravel()]
    want = [v.split(":") for v in expected["outputs"][0]["data"]]
    assert [t[1:] for t in top] == [w[1:] for w in want]  # classes and labels; values to the last printed digit
    assert [float(t[0]) for t in top] == pytest.approx([float(w[0]) for w in want], abs=1e-5)
    assert got.as_numpy("conv1").shape == (2, 6, 28, 28)
    with pytest.raises(InferenceServerException) as missing:
        client.infer("nope", [tensor])
    assert missing.value.status() == "StatusCode.NOT_FOUND"
    assert "no model named 'nope'" in str(missing.value.message())
    with pytest.raises(InferenceServerException) as refused:
        client.unload_model("lenet", headers={"authorization": f"Bearer {ADMIN}"})
    assert refused.value.status() == "StatusCode.FAILED_PRECONDITION"
    assert "Serve config" in str(refused.value.message())
    stats = client.get_inference_statistics(as_json=True)["model_stats"]
    assert [m["name"] for m in stats] == ["lenet", "slow"]
    assert client.get_model_config("lenet", as_json=True)["config"]["name"] == "lenet"
    client.close()


def test_requests_spread_over_both_replicas(replicated: Deployed) -> None:
    body = tensor_body("lenet", digits(1, seed=4))
    seen: set[str] = set()
    with httpx.Client(timeout=60) as client:
        for _ in range(200):
            response = client.post(f"{replicated.url}/predict", json=body)
            assert response.status_code == 200, response.text
            seen.add(replica_of(response))
            if len(seen) == 2:
                break
    assert len(seen) == 2, f"all answers came from {seen}"
    assert all(name.startswith(f"{DEPLOYMENT}#") for name in seen)


def test_health_and_model_list_answer_for_the_cluster(replicated: Deployed) -> None:
    url = replicated.url
    assert httpx.get(f"{url}/healthz").json() == {"status": "ok"}
    assert httpx.get(f"{url}/readyz").status_code == 200
    names = [m["name"] for m in httpx.get(f"{url}/models").json()["models"]]
    assert names == ["lenet", "slow"]
    metrics = httpx.get(f"{url}/metrics")
    assert metrics.status_code == 404
    assert "Ray's metrics export" in metrics.json()["detail"]


def test_admin_load_and_unload_are_refused_with_409(replicated: Deployed) -> None:
    url = replicated.url
    auth = {"Authorization": f"Bearer {ADMIN}"}
    spec = {"name": "lenet2", "source": "python", "architecture": "service.zoo.lenet:LeNet"}
    assert httpx.post(f"{url}/models", json=spec).status_code == 401
    assert httpx.post(f"{url}/models", json=spec, headers={"Authorization": "Bearer wrong"}).status_code == 401
    refused = httpx.post(f"{url}/models", json=spec, headers=auth)
    assert refused.status_code == 409
    assert "Serve config" in refused.json()["detail"]
    assert httpx.delete(f"{url}/models/lenet", headers=auth).status_code == 409
    v2 = httpx.post(f"{url}/v2/repository/models/lenet/unload", headers=auth)
    assert v2.status_code == 409
    assert "Serve config" in v2.json()["error"]
    assert [m["status"] for m in httpx.get(f"{url}/models").json()["models"]] == ["ready", "ready"]


def test_bad_input_is_a_4xx(replicated: Deployed) -> None:
    url = replicated.url
    bad_json = httpx.post(f"{url}/predict", content=b"{not json", headers={"Content-Type": "application/json"})
    assert bad_json.status_code == 400
    assert httpx.post(f"{url}/predict", json={"model": "nope", "inputs": []}).status_code in (404, 422)
    assert httpx.post(f"{url}/predict", json={"inputs": []}).status_code == 422
    assert httpx.get(f"{url}/v2/models/nope").status_code == 404


def _replicas_in_ray_metrics(cluster: RayCluster) -> set[str]:
    try:
        text = httpx.get(cluster.metrics_url, timeout=10).text
    except httpx.TransportError:
        return set()
    found = set()
    for line in text.splitlines():
        if line.startswith("ray_hookserve_requests_total{") and f'deployment="{DEPLOYMENT}"' in line:
            found.add(line.split('replica="', 1)[1].split('"', 1)[0])
    return found


def test_each_replica_exports_its_metrics_through_ray(replicated: Deployed) -> None:
    body = tensor_body("lenet", digits(1, seed=5))
    ids: set[str] = set()
    with httpx.Client(timeout=60) as client:
        for _ in range(200):
            ids.add(replica_of(client.post(f"{replicated.url}/predict", json=body)).split("#", 1)[1])
            if len(ids) == 2:
                break

    def exported() -> bool:
        return ids <= _replicas_in_ray_metrics(replicated.cluster)

    wait_for(exported, 90, f"ray_hookserve_requests_total of replicas {ids}", poll=1.0)


@dataclass
class Load:
    """Clients posting slow predictions until told to stop; every answer kept."""

    url: str
    clients: int = 4
    max_requests: int = 2000
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    answers: list[tuple[int, str | None, str | None]] = field(default_factory=list)  # status, replica, retry-after
    errors: list[str] = field(default_factory=list)

    def run(self) -> list[threading.Thread]:
        threads = [threading.Thread(target=self._client, daemon=True) for _ in range(self.clients)]
        for thread in threads:
            thread.start()
        return threads

    def _client(self) -> None:
        body = {"model": "slow", "inputs": [slow_input(0.25, fill=0.5)]}
        with httpx.Client(timeout=120) as client:
            while not self.stop.is_set() and len(self.answers) < self.max_requests:
                try:
                    r = client.post(f"{self.url}/predict", json=body)
                except httpx.TransportError as exc:
                    with self.lock:
                        self.errors.append(repr(exc))
                    continue
                with self.lock:
                    self.answers.append(
                        (r.status_code, r.headers.get("x-hookserve-replica"), r.headers.get("retry-after"))
                    )

    def replicas(self) -> set[str]:
        with self.lock:
            return {replica for status, replica, _ in self.answers if status == 200 and replica}

    def count(self) -> int:
        with self.lock:
            return len(self.answers)


def test_a_replica_killed_under_load_is_replaced_and_no_request_gets_a_500(replicated: Deployed) -> None:
    load = Load(replicated.url)
    threads = load.run()
    try:
        wait_for(lambda: len(load.replicas()) == 2, 120, "both replicas busy")
        before = load.replicas()
        pids = replica_pids(APP, DEPLOYMENT)
        assert len(pids) == 2, f"replica processes: {pids}"
        at_kill = load.count()
        os.kill(pids[0], signal.SIGKILL)
        replacement = wait_for(
            lambda: load.replicas() - before, 180, "a new replica answering in place of the killed one", poll=0.25
        )
        wait_for(lambda: load.count() > at_kill + 8, 120, "requests served after the kill")
    finally:
        load.stop.set()
        for thread in threads:
            thread.join(120)
    statuses = {status for status, _, _ in load.answers}
    assert 500 not in statuses, f"a client got a 500: {sorted(statuses)}"
    assert statuses <= {200, 503}, sorted(statuses)
    assert all(retry is not None for status, _, retry in load.answers if status == 503), "503 without Retry-After"
    assert not load.errors, load.errors[:3]
    assert len(replacement) == 1
    wait_for(lambda: running_replicas(APP, DEPLOYMENT) == 2, 120, "the deployment healthy with 2 replicas again")
    assert len(replica_pids(APP, DEPLOYMENT)) == 2
    assert pids[0] not in replica_pids(APP, DEPLOYMENT)
