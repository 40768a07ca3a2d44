"""The replicated layout through `python -m service.cluster` on its own local Ray: two replicas behind its front.

As a user runs it (Ray's defaults, token auth on, HOME an empty folder): every Ray address on
loopback but each replica's gRPC port, nothing written under HOME, replicas at nice 0. The API
answers as one process does, requests spread over both replicas (the header says which
answered), each answer has one `X-Request-ID`, admin load/unload is a 409, and each replica's
metrics reach Ray's export. Then the faults, each under 8 clients: a replica killed by PID, the
Serve controller killed, every replica killed (503 with Retry-After until the replacements
come, not a wait), and SIGTERM (the requests in flight finish, everything stops, exit 0).
Through all of them no client sees a 500 or a dropped connection.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import signal
import stat
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest
from fastapi.testclient import TestClient

from service.cluster import local_ray
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
from tests.cluster.conftest import ClusterProcess, replica_pids, wait_for
from tests.cluster.load import Load, check_answers
from tests.conftest import write_lenet
from tests.reliability.live_server import write_slow

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
no_replica_wait_s = 1
"""


@dataclass
class Deployed:
    url: str
    port: int
    grpc_port: int
    ref: TestClient
    process: ClusterProcess
    home: Path
    ray_dir: Path

    @property
    def tree(self) -> list[psutil.Process]:
        """The command and every process it started (Ray's daemons, the controller, the replicas)."""
        assert self.process.process is not None
        root = psutil.Process(self.process.process.pid)
        return [root, *root.children(recursive=True)]

    def titled(self, word: str) -> list[psutil.Process]:
        found = []
        for proc in self.tree:
            try:
                if word in " ".join(proc.cmdline()):
                    found.append(proc)
            except psutil.Error:
                continue
        return found


@pytest.fixture(scope="module")
def replicated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployed]:
    model_dir = tmp_path_factory.mktemp("replicated")
    home = model_dir / "home"
    home.mkdir()
    ray_dir = Path(tempfile.mkdtemp(prefix="hsrep-", dir="/tmp"))  # short: Ray puts unix sockets in it
    config = model_dir / "models.toml"
    config.write_text(write_lenet(model_dir) + write_slow(model_dir) + CLUSTER_TABLE)
    process = ClusterProcess(
        None,
        model_dir,
        ["--config", str(config), "--model-dir", str(model_dir), "--ray-cpus", "2", "--temp-dir", str(ray_dir)],
        env={"HOOKSERVE_ADMIN_TOKEN": ADMIN, "HOOKSERVE_SHUTDOWN_GRACE_S": "30", "HOME": str(home)},
    )
    ref = reference_client(model_dir, config)
    try:
        process.start(timeout=300)
        yield Deployed(process.url, process.port, process.grpc_port, ref, process, home, ray_dir)
    finally:
        ref.__exit__(None, None, None)
        process.stop(120)
        shutil.rmtree(ray_dir, ignore_errors=True)


def _loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip)
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def test_ray_keeps_to_loopback_and_out_of_home_and_runs_the_replicas_at_nice_0(replicated: Deployed) -> None:
    """Every listening socket of the command's process tree is on loopback but each Serve replica's gRPC port
    (Ray Serve binds it to [::], with no setting; token auth guards it), Ray's token is beside its files, not in
    HOME, and the replicas run at nice 0 (Ray's default for workers is 15)."""
    pids = {p.pid: p for p in replicated.tree}
    wide = []
    for conn in psutil.net_connections("tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.pid in pids and not _loopback(conn.laddr.ip):
            wide.append((conn.laddr.ip, " ".join(pids[conn.pid].cmdline())))
    replicas = replicated.titled(f"ServeReplica:{APP}:{DEPLOYMENT}")
    assert len(replicas) == 2
    assert len(wide) == 2, wide
    assert all(ip in ("::", "0.0.0.0") and f"ServeReplica:{APP}" in title for ip, title in wide), wide
    assert {p.nice() for p in replicas} == {0}
    token = replicated.ray_dir / local_ray.TOKEN_FILE
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    assert f"RAY_AUTH_TOKEN_PATH={token}" in replicated.process.log()  # how to point Ray's CLI at it
    assert not (replicated.home / ".ray").exists()


def test_the_api_answers_as_one_process_does(replicated: Deployed) -> None:
    check_predict(replicated.url, replicated.ref, "lenet", DEPLOYMENT)
    check_activations(replicated.url, replicated.ref, "lenet", DEPLOYMENT)
    check_saliency(replicated.url, replicated.ref, "lenet", DEPLOYMENT)


def test_v2_through_tritonclient(replicated: Deployed) -> None:
    check_v2(replicated.port, replicated.ref, "lenet")


def test_grpc_through_the_front(replicated: Deployed) -> None:
    """tritonclient.grpc, unchanged, against the front's gRPC port: answers as the single process does."""
    import tritonclient.grpc as tgrpc
    from tritonclient.utils import InferenceServerException

    client = tgrpc.InferenceServerClient(f"127.0.0.1:{replicated.grpc_port}")
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


def _replicas_in_ray_metrics(ray_dir: Path) -> set[str]:
    """Replica ids in `ray_hookserve_requests_total` of every node Ray lists for Prometheus."""
    found: set[str] = set()
    try:
        targets = json.loads((ray_dir / "prom_metrics_service_discovery.json").read_text())
        texts = [httpx.get(f"http://{t}/metrics", timeout=10).text for entry in targets for t in entry["targets"]]
    except (OSError, ValueError, httpx.TransportError):
        return found
    for text in texts:
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
        return ids <= _replicas_in_ray_metrics(replicated.ray_dir)

    wait_for(exported, 90, f"ray_hookserve_requests_total of replicas {ids}", poll=1.0)


def test_each_answer_has_one_request_id_the_clients_when_valid(replicated: Deployed) -> None:
    url = replicated.url
    body = tensor_body("lenet", digits(1, seed=6))
    forwarded = httpx.post(f"{url}/predict", json=body, headers={"X-Request-ID": "trace-17.a"})
    own = httpx.get(f"{url}/healthz", headers={"X-Request-ID": "trace-18"})  # the front answers this itself
    fresh = httpx.post(f"{url}/predict", json=body, headers={"X-Request-ID": "not valid!"})
    for response, want in ((forwarded, "trace-17.a"), (own, "trace-18"), (fresh, None)):
        ids = response.headers.get_list("x-request-id")
        assert len(ids) == 1, (response.url, ids)
        assert ids[0] == want if want else len(ids[0]) == 32
        assert response.headers["x-content-type-options"] == "nosniff"


def _both_replicas_answer(url: str) -> None:
    """Until two replicas (new ones after a kill) have answered."""
    body = tensor_body("lenet", digits(1, seed=4))

    def two() -> bool:
        seen = set()
        with httpx.Client(timeout=60) as client:
            for _ in range(40):
                response = client.post(f"{url}/predict", json=body)
                if response.status_code == 200:
                    seen.add(replica_of(response))
                if len(seen) == 2:
                    return True
        return False

    wait_for(two, 240, "two replicas answering", poll=0.5)


def test_the_serve_controller_killed_under_load_costs_no_client_anything(replicated: Deployed) -> None:
    (controller,) = replicated.titled("ray::ServeController")
    load = Load(replicated.url).start()
    try:
        wait_for(lambda: load.count() > 16, 60, "requests answered before the kill")
        controller.kill()  # SIGKILL; Ray restarts it, the replicas keep running meanwhile
        killed_at = time.monotonic()
        wait_for(
            lambda: [p for p in replicated.titled("ray::ServeController") if p.pid != controller.pid],
            120,
            "a new controller",
        )
        wait_for(lambda: len(load.replicas(since=killed_at)) == 2, 60, "both replicas answering after the kill")
    finally:
        load.finish()
    check_answers(load)
    assert all(a.status == 200 for a in load.answers), sorted({a.status for a in load.answers})


def _refused(load: Load, since: float) -> bool:
    with load.lock:
        return any(a.status == 503 for a in load.answers if a.sent >= since)


def _hold_outage(load: Load, since: float, timeout: float = 60.0) -> set[int]:
    """Kill every replica of the deployment, and any replacement Ray starts, until a client has been refused with
    a 503 (or `timeout`, which fails the test): on a quiet machine a replacement can start within a second, so
    killing once leaves no outage to observe. Returns every pid killed."""
    killed: set[int] = set()

    def none_left_and_refused() -> bool:
        for pid in replica_pids(APP, DEPLOYMENT):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            killed.add(pid)
        return _refused(load, since)

    wait_for(none_left_and_refused, timeout, "a 503 while no replica was left", poll=0.05)
    return killed


def test_a_replica_killed_costs_nothing_and_with_none_left_clients_get_503_not_a_wait(replicated: Deployed) -> None:
    """Two kills under load, one replacement cycle. One replica killed: its requests are retried on the other,
    which keeps answering; no client sees anything. Then the other too, and every replacement Ray starts until a
    client has been refused (on a quiet machine one starts within a second): until a replacement runs, each request
    waits at most no_replica_wait_s (1 s here), then gets a JSON 503 with Retry-After, and the first such 503
    comes before the first replacement answers."""
    load = Load(replicated.url).start()
    try:
        wait_for(lambda: len(load.replicas()) == 2, 120, "both replicas busy")
        before = load.replicas()
        first, second = replica_pids(APP, DEPLOYMENT)
        first_killed = time.monotonic()
        os.kill(first, signal.SIGKILL)
        survivor = wait_for(lambda: load.replicas(since=first_killed + 1.0), 60, "answers after the first kill")
        wait_for(lambda: load.count(since=first_killed) >= 24, 60, "requests answered after the first kill")
        alone = [a for a in load.answers if a.sent > first_killed]
        assert second in replica_pids(APP, DEPLOYMENT)
        second_killed = time.monotonic()
        everyone = _hold_outage(load, since=second_killed)
        wait_for(lambda: load.replicas(since=second_killed) - before, 240, "a replacement answering")
    finally:
        load.finish()
    check_answers(load)
    assert all(a.status == 200 for a in alone), sorted({a.status for a in alone})  # the kill cost nobody anything
    assert len(survivor) == 1
    after = [a for a in load.answers if a.sent > second_killed]
    refused = [a for a in after if a.status == 503]
    assert refused, "no 503 while no replica was left"
    first_new = min(a.answered for a in after if a.status == 200 and a.replica not in before)
    assert min(a.answered for a in refused) < first_new, "clients waited for the replacement instead of a 503"
    _both_replicas_answer(replicated.url)
    assert not {first, *everyone} & set(replica_pids(APP, DEPLOYMENT))


def test_sigterm_under_load_finishes_the_requests_in_flight_then_exits_0(replicated: Deployed) -> None:
    """Runs last in this module: it stops the command. Clients stop sending, then the signal comes while their
    last (1 s) requests are in flight: every one is answered, none is dropped, and the command exits 0."""
    load = Load(replicated.url, seconds=1.0).start()
    wait_for(lambda: load.count() >= 8, 60, "requests answered before the signal")
    load.stop.set()  # no new requests: any connection opened after the signal would be refused, as by one process
    time.sleep(0.2)  # what a client sent before `stop` has reached the front
    signalled = time.monotonic()
    replicated.process.signal(signal.SIGTERM)
    code = replicated.process.process.wait(120) if replicated.process.process else None
    load.finish()
    assert code == 0, replicated.process.log()
    check_answers(load)
    drained = [a for a in load.answers if a.answered > signalled]
    assert drained, "no request was in flight at the signal"
    assert all(a.status == 200 for a in drained), [a.status for a in drained]
    wait_for(lambda: not replica_pids(APP, DEPLOYMENT), 60, "the replicas gone with the command")
    assert not (replicated.home / ".ray").exists()
