"""Ray's own tooling (`serve run service.cluster.app:build ...`): the router deployment behind Serve's HTTP proxy.

No `python -m service.cluster` here: Serve's proxy takes the HTTP requests and hands them to
the router deployment, two replicas of it by default, which forwards them as the command's
front does (the same `RouterApp`; its routing is tested without Ray). Each answer still has
exactly one `X-Request-ID` (Serve's proxy adds one: the router leaves the app's off, the same id).
Serve's gRPC proxy calls the router deployment's method of each RPC, routed as the front routes them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.cluster.app import build
from tests.cluster.api_checks import digits, replica_of, tensor_body
from tests.cluster.conftest import RayCluster, running_replicas, wait_for, wait_ready
from tests.conftest import write_lenet

APP = "tooling"


@pytest.fixture(scope="module")
def tooling(ray_cluster: RayCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    from ray import serve

    model_dir: Path = tmp_path_factory.mktemp("tooling")
    config = model_dir / "models.toml"
    config.write_text(write_lenet(model_dir) + write_lenet(model_dir, "lenet2"))
    args = {"config": str(config), "model_dir": str(model_dir), "replicas": "1", "num_cpus": "0.5", "app_name": APP}
    serve.run(build(args), name=APP, route_prefix="/", blocking=False)
    try:
        wait_ready(ray_cluster.url)
        yield ray_cluster
    finally:
        serve.delete(APP)


def test_serve_run_puts_two_router_replicas_behind_serves_proxy(tooling: RayCluster) -> None:
    assert running_replicas(APP, "router") == 2
    body = tensor_body("lenet2", digits(1, seed=11))
    response = httpx.post(f"{tooling.url}/predict", json=body, timeout=60)
    assert response.status_code == 200, response.text
    assert replica_of(response).startswith("group-models#")
    listed = httpx.get(f"{tooling.url}/models", timeout=60).json()["models"]
    assert [m["name"] for m in listed] == ["lenet", "lenet2"]


def test_each_answer_has_one_request_id_behind_serves_proxy(tooling: RayCluster) -> None:
    body = tensor_body("lenet", digits(1, seed=12))
    given = httpx.post(f"{tooling.url}/predict", json=body, headers={"X-Request-ID": "tool-1"}, timeout=60)
    assert given.headers.get_list("x-request-id") == ["tool-1"]
    fresh = httpx.post(f"{tooling.url}/predict", json=body, timeout=60)
    assert len(fresh.headers.get_list("x-request-id")) == 1
    own = httpx.get(f"{tooling.url}/healthz", timeout=60)  # the router answers this itself
    assert len(own.headers.get_list("x-request-id")) == 1


def test_grpc_through_serves_grpc_proxy_reaches_the_router_deployment(tooling: RayCluster) -> None:
    import tritonclient.grpc as tgrpc
    from tritonclient.utils import InferenceServerException

    app = {"application": APP}  # other applications may run on the session's cluster
    client = tgrpc.InferenceServerClient(f"127.0.0.1:{tooling.grpc_port}")

    def ready() -> bool:  # Serve starts its gRPC proxy beside the HTTP one that wait_ready saw answer
        try:
            return bool(client.is_server_ready(headers=app))
        except InferenceServerException:
            return False

    try:
        wait_for(ready, 60, f"Serve's gRPC proxy on port {tooling.grpc_port}", poll=0.5)
        x = digits(1, seed=13)
        tensor = tgrpc.InferInput("input__0", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        got = client.infer("lenet2", [tensor], headers=app)
        assert got.as_numpy("output__0").shape == (1, 10)
        with pytest.raises(InferenceServerException) as missing:
            client.infer("nope", [tensor], headers=app)
        assert missing.value.status() == "StatusCode.NOT_FOUND"
    finally:
        client.close()
