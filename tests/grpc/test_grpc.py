"""The gRPC front against a live server, driven by `tritonclient.grpc` itself (and, beside it, `tritonclient.http`).

One server for the module: lenet (trained weights, labels) and a model that sleeps on request
(deadlines, cancellation), gRPC on a free port beside HTTP.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
import pytest
import torch
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from fastapi import FastAPI
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from service.codecs.protos import inference_pb2 as pb
from service.config import Settings
from service.main import create_app
from service.registry.builtin import ZOO_DIR
from service.runtime.executor import ModelExecutor
from service.zoo.lenet import LeNet, load_lenet, samples_dir
from tests.helpers.serving import uvicorn_thread
from tests.helpers.waiting import PATIENCE_S, wait_until
from tests.reliability.live_server import write_slow

ADMIN = "s3cret"
MAX_INPUTS = 6
BODY_LIMIT = 1024 * 1024
LENET = """
[[models]]
name = "lenet"
source = "python"
architecture = "service.zoo.lenet:LeNet"
weights = "lenet_digits.pt"
labels = "digits_labels.txt"
input_size = [3, 32, 32]
max_batch_size = 4
max_batch_delay_ms = 2
"""


@dataclass
class Live:
    app: FastAPI
    http_url: str  # host:port
    grpc_url: str
    grpc: tgrpc.InferenceServerClient
    http: thttp.InferenceServerClient

    def executor(self, model: str) -> ModelExecutor:
        return self.app.state.hookserve.fleet.ready(model).executor  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    model_dir = tmp_path_factory.mktemp("models")
    shutil.copy(ZOO_DIR / "weights" / "lenet_digits.pt", model_dir)
    shutil.copy(ZOO_DIR / "digits_labels.txt", model_dir)
    (model_dir / "models.toml").write_text(LENET + write_slow(model_dir))
    settings = Settings(
        model_dir=model_dir,
        config=model_dir / "models.toml",
        worker_threads=1,
        torch_threads=1,
        admin_token=ADMIN,
        max_inputs=MAX_INPUTS,
        max_body_bytes=BODY_LIMIT,
        grpc_port=0,
    )
    app = create_app(settings)
    with uvicorn_thread(app) as base:
        http_url = base.removeprefix("http://")
        grpc_url = f"127.0.0.1:{app.state.ports['grpc']}"
        client = tgrpc.InferenceServerClient(grpc_url)
        wait_until(client.is_server_ready, "models did not load")
        yield Live(app, http_url, grpc_url, client, thttp.InferenceServerClient(http_url, network_timeout=60))
        client.close()


@pytest.fixture(scope="module")
def lenet() -> LeNet:
    return load_lenet()


def digits(n: int, seed: int = 0) -> np.ndarray[Any, Any]:
    return np.random.default_rng(seed).standard_normal((n, 3, 32, 32)).astype(np.float32)


def grpc_input(x: np.ndarray[Any, Any], name: str = "input__0", datatype: str = "FP32") -> tgrpc.InferInput:
    tensor = tgrpc.InferInput(name, list(x.shape), datatype)
    tensor.set_data_from_numpy(x)
    return tensor


def http_input(x: np.ndarray[Any, Any]) -> thttp.InferInput:
    tensor = thttp.InferInput("input__0", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=True)
    return tensor


def grpc_error(call: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call()
    return info.value


def http_error(call: Any) -> InferenceServerException:
    return grpc_error(call)


def slow_sample(delay: float) -> np.ndarray[Any, Any]:
    x = np.zeros((1, 1, 4, 4), dtype=np.float32)
    x.flat[0] = delay
    return x


def stats_of(client: tgrpc.InferenceServerClient, model: str) -> dict[str, Any]:
    found: dict[str, Any] = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
    return found


def count(stats: dict[str, Any], *path: str) -> int:
    value: Any = stats
    for key in path:
        value = value.get(key, {} if key != path[-1] else 0)
    return int(value)  # proto3 JSON leaves zeros out and prints 64-bit numbers as strings


def grew(before: dict[str, Any], after: dict[str, Any], *path: str) -> int:
    return count(after, *path) - count(before, *path)


# ---- health and metadata -----------------------------------------------------------------


def test_health_and_metadata_match_rest(live: Live) -> None:
    assert live.grpc.is_server_live()
    assert live.grpc.is_server_ready()
    assert live.grpc.is_model_ready("lenet")
    assert not live.grpc.is_model_ready("lenet", "7")  # tritonclient reads NOT_FOUND as not ready
    meta = live.grpc.get_server_metadata(as_json=True)
    assert meta["name"] == "hookserve"
    assert meta["extensions"] == live.http.get_server_metadata()["extensions"]
    assert {"binary_tensor_data", "classification", "model_repository", "model_configuration", "statistics"} <= set(
        meta["extensions"]
    )
    model = live.grpc.get_model_metadata("lenet", as_json=True)
    rest = live.http.get_model_metadata("lenet")
    assert model["name"] == rest["name"] == "lenet"
    assert model["platform"] == rest["platform"]
    for side in ("inputs", "outputs"):
        assert [(t["name"], t["datatype"], [int(s) for s in t["shape"]]) for t in model[side]] == [
            (t["name"], t["datatype"], t["shape"]) for t in rest[side]
        ]


# ---- inference ---------------------------------------------------------------------------


def test_binary_inference_equals_the_model_and_rest(live: Live, lenet: LeNet) -> None:
    x = digits(3)
    result = live.grpc.infer("lenet", [grpc_input(x)], request_id="r-7")
    got = result.as_numpy("output__0")
    with torch.inference_mode():
        expected = lenet(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    assert result.get_response(as_json=True)["id"] == "r-7"
    rest = live.http.infer("lenet", [http_input(x)])
    np.testing.assert_array_equal(got, rest.as_numpy("output__0"))


def test_classification_and_layer_outputs_as_over_rest(live: Live, lenet: LeNet) -> None:
    x = digits(2, seed=1)
    outputs = [tgrpc.InferRequestedOutput("output__0", class_count=3), tgrpc.InferRequestedOutput("conv1")]
    result = live.grpc.infer("lenet", [grpc_input(x)], outputs=outputs)
    rest = live.http.infer(
        "lenet",
        [http_input(x)],
        outputs=[thttp.InferRequestedOutput("output__0", class_count=3), thttp.InferRequestedOutput("conv1")],
    )
    top = result.as_numpy("output__0")
    assert top.shape == (2, 3)
    np.testing.assert_array_equal(top, rest.as_numpy("output__0"))
    value, index, label = top[0, 0].decode().split(":")
    with torch.inference_mode():
        logits = lenet(torch.from_numpy(x))
        conv1 = lenet.conv1(torch.from_numpy(x)).numpy()
    assert int(index) == int(logits[0].argmax())
    assert label == str(int(index))  # the digits' labels are their names
    assert float(value) == pytest.approx(float(logits[0].max()), abs=1e-5)
    np.testing.assert_allclose(result.as_numpy("conv1"), conv1, rtol=1e-4, atol=1e-4)


def test_images_as_bytes_are_preprocessed_like_rest(live: Live) -> None:
    pngs = np.array([(samples_dir() / f"digit_{d}.png").read_bytes() for d in (3, 7)], dtype=np.object_)
    result = live.grpc.infer(
        "lenet", [grpc_input(pngs, datatype="BYTES")], outputs=[tgrpc.InferRequestedOutput("output__0", class_count=1)]
    )
    tops = [row[0].decode().split(":")[2] for row in result.as_numpy("output__0")]
    assert tops == ["3", "7"]
    body = thttp.InferInput("input__0", [2], "BYTES")
    body.set_data_from_numpy(pngs)
    rest = live.http.infer("lenet", [body], outputs=[thttp.InferRequestedOutput("output__0", class_count=1)])
    np.testing.assert_array_equal(result.as_numpy("output__0"), rest.as_numpy("output__0"))
    assert serialize_byte_tensor(pngs) is not None


def raw_call(live: Live, method: str, request: Any, response: Any, **kwargs: Any) -> Any:
    """Call a method with hookserve's own messages (what tritonclient does not send: typed contents)."""
    with grpc.insecure_channel(live.grpc_url) as channel:
        call = channel.unary_unary(
            f"/inference.GRPCInferenceService/{method}",
            request_serializer=request.SerializeToString,
            response_deserializer=response.FromString,
        )
        return call(request, **kwargs)


def test_typed_contents_are_read_and_answers_are_raw(live: Live, lenet: LeNet) -> None:
    x = digits(1, seed=2)
    request = pb.ModelInferRequest(model_name="lenet")
    request.inputs.add(name="input__0", datatype="FP32", shape=[1, 3, 32, 32]).contents.fp32_contents.extend(
        x.reshape(-1).tolist()
    )
    answer = raw_call(live, "ModelInfer", request, pb.ModelInferResponse)
    assert [o.name for o in answer.outputs] == ["output__0"]
    got = np.frombuffer(answer.raw_output_contents[0], dtype="<f4").reshape(list(answer.outputs[0].shape))
    with torch.inference_mode():
        np.testing.assert_allclose(got, lenet(torch.from_numpy(x)).numpy(), rtol=1e-4, atol=1e-4)
    request.inputs[0].datatype = "FP16"
    with pytest.raises(grpc.RpcError) as info:
        raw_call(live, "ModelInfer", request, pb.ModelInferResponse)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "only as raw_input_contents" in str(info.value.details())


# ---- errors ------------------------------------------------------------------------------


def test_errors_are_status_codes_with_rest_details(live: Live) -> None:
    x = digits(1)
    cases = [
        (lambda c, i: c.infer("nope", [i(x)]), "StatusCode.NOT_FOUND", 404),
        (lambda c, i: c.infer("lenet", [i(digits(MAX_INPUTS + 1))]), "StatusCode.RESOURCE_EXHAUSTED", 413),
        (lambda c, i: c.infer("lenet", [i(x[:, :1])]), "StatusCode.INVALID_ARGUMENT", 422),
    ]
    for call, code, status in cases:
        over_grpc = grpc_error(lambda call=call: call(live.grpc, grpc_input))
        over_rest = http_error(lambda call=call: call(live.http, http_input))
        assert over_grpc.status() == code
        assert over_rest.status() == str(status)
        assert over_grpc.message() == over_rest.message()
    conv = [tgrpc.InferRequestedOutput("conv")]
    unknown = grpc_error(lambda: live.grpc.infer("lenet", [grpc_input(x)], outputs=conv))
    assert unknown.status() == "StatusCode.INVALID_ARGUMENT"
    assert "closest: 'conv2', 'conv1'" in str(unknown.message())


def test_a_request_over_the_body_limit_is_refused_before_decoding(live: Live) -> None:
    big = np.zeros((4, 3, 160, 160), dtype=np.float32)  # 1.2 MB, over the 1 MiB body limit
    error = grpc_error(lambda: live.grpc.infer("lenet", [grpc_input(big)]))
    assert error.status() == "StatusCode.RESOURCE_EXHAUSTED"


# ---- deadlines and cancellation ----------------------------------------------------------


def test_a_deadline_gives_up_the_queued_request(live: Live) -> None:
    before = stats_of(live.grpc, "slow")
    results: list[Any] = []
    first = threading.Thread(target=lambda: results.append(live.grpc.infer("slow", [grpc_input(slow_sample(1.5))])))
    first.start()
    wait_until(lambda: live.executor("slow").running == 1, "the first request never ran")
    late = grpc_error(lambda: live.grpc.infer("slow", [grpc_input(slow_sample(1.5))], client_timeout=0.3))
    assert late.status() == "StatusCode.DEADLINE_EXCEEDED"
    first.join(PATIENCE_S)
    assert len(results) == 1
    live.grpc.infer("slow", [grpc_input(slow_sample(0.0))])
    after = stats_of(live.grpc, "slow")
    # the late request never ran: two forwards (the first and the last), and one failed request
    assert grew(before, after, "execution_count") == 2
    assert grew(before, after, "inference_stats", "fail", "count") == 1
    assert grew(before, after, "inference_stats", "success", "count") == 2


def test_cancelling_a_call_abandons_its_job(live: Live) -> None:
    before = stats_of(live.grpc, "slow")
    done = threading.Event()
    live.grpc.async_infer("slow", [grpc_input(slow_sample(1.0))], callback=lambda result, error: done.set())
    wait_until(lambda: live.executor("slow").running == 1, "the first request never ran")
    call = live.grpc.async_infer("slow", [grpc_input(slow_sample(1.0))], callback=lambda result, error: None)
    wait_until(lambda: live.executor("slow").queue_depth == 1, "the second request never queued")
    call.cancel()
    assert done.wait(PATIENCE_S)
    live.grpc.infer("slow", [grpc_input(slow_sample(0.0))])
    after = stats_of(live.grpc, "slow")
    assert grew(before, after, "execution_count") == 2  # the cancelled one never ran
    assert grew(before, after, "inference_stats", "fail", "count") == 1


# ---- the admin token ---------------------------------------------------------------------


def test_repository_calls_need_the_admin_token_as_metadata(live: Live) -> None:
    index = {m["name"]: m["state"] for m in live.grpc.get_model_repository_index(as_json=True)["models"]}
    assert index == {"lenet": "READY", "slow": "READY"}
    missing = grpc_error(lambda: live.grpc.unload_model("slow"))
    assert missing.status() == "StatusCode.UNAUTHENTICATED"
    assert "Authorization: Bearer" in str(missing.message())
    wrong = grpc_error(lambda: live.grpc.unload_model("slow", headers={"authorization": "Bearer nope"}))
    assert wrong.status() == "StatusCode.UNAUTHENTICATED"
    auth = {"authorization": f"Bearer {ADMIN}"}
    live.grpc.unload_model("slow", headers=auth)
    assert not live.grpc.is_model_ready("slow")
    gone = grpc_error(lambda: live.grpc.infer("slow", [grpc_input(slow_sample(0.0))]))
    assert gone.status() == "StatusCode.NOT_FOUND"
    live.grpc.load_model("slow", headers=auth)
    assert live.grpc.is_model_ready("slow")


# ---- Triton's config and statistics, over both clients -----------------------------------


def test_model_config_is_what_triton_would_say_on_both_fronts(live: Live) -> None:
    over_grpc = live.grpc.get_model_config("lenet", as_json=True)["config"]
    over_rest = live.http.get_model_config("lenet")
    assert over_rest["name"] == over_grpc["name"] == "lenet"
    assert over_rest["platform"] == over_grpc["platform"] == "pytorch_libtorch"
    assert over_rest["backend"] == "pytorch"
    assert over_rest["max_batch_size"] == int(over_grpc["max_batch_size"]) == 4
    assert over_rest["input"] == [
        {
            "name": "input__0",
            "data_type": "TYPE_FP32",
            "format": "FORMAT_NCHW",
            "dims": [3, 32, 32],
            "is_shape_tensor": False,
            "allow_ragged_batch": False,
            "optional": False,
            "is_non_linear_format_io": False,
        }
    ]
    assert [(o["name"], o["data_type"], o["dims"], o["label_filename"]) for o in over_rest["output"]] == [
        ("output__0", "TYPE_FP32", [10], "digits_labels.txt")
    ]
    assert [int(d) for d in over_grpc["output"][0]["dims"]] == [10]
    batching = over_rest["dynamic_batching"]
    assert batching["max_queue_delay_microseconds"] == 2000
    assert batching["default_queue_policy"]["max_queue_size"] == 256
    assert over_rest["instance_group"][0]["kind"] == over_grpc["instance_group"][0]["kind"] == "KIND_CPU"
    assert over_rest["instance_group"][0]["count"] == 1
    assert over_rest["parameters"]["source"] == {"string_value": "python"}
    assert grpc_error(lambda: live.grpc.get_model_config("nope")).status() == "StatusCode.NOT_FOUND"


def test_statistics_count_every_front_and_agree(live: Live) -> None:
    probed = stats_of(live.grpc, "slow")
    live.grpc.get_model_config("slow")  # its first probe of the outputs since it was loaded again: not a request
    assert stats_of(live.grpc, "slow") == probed
    before = live.http.get_inference_statistics("lenet")["model_stats"][0]
    live.grpc.infer("lenet", [grpc_input(digits(2))])
    live.http.infer("lenet", [http_input(digits(3))])
    grpc_error(lambda: live.grpc.infer("lenet", [grpc_input(digits(1))], outputs=[tgrpc.InferRequestedOutput("x")]))
    over_rest = live.http.get_inference_statistics("lenet")["model_stats"][0]
    over_grpc = stats_of(live.grpc, "lenet")
    assert over_rest["inference_count"] - before["inference_count"] == 5
    assert over_rest["inference_count"] == count(over_grpc, "inference_count")
    stats = over_rest["inference_stats"]
    assert stats["success"]["count"] - before["inference_stats"]["success"]["count"] == 2
    for phase in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert stats[phase]["count"] == stats["success"]["count"] + stats["fail"]["count"]
        assert stats[phase]["ns"] > 0
        assert stats[phase]["count"] == count(over_grpc, "inference_stats", phase, "count")
    assert stats["success"]["ns"] >= stats["compute_infer"]["ns"]
    assert over_rest["last_inference"] > 0
    sizes = {b["batch_size"]: b for b in over_rest["batch_stats"]}
    assert {2, 3} <= set(sizes)
    assert sum(b["compute_infer"]["count"] for b in sizes.values()) == over_rest["execution_count"]
    every = live.http.get_inference_statistics()["model_stats"]
    assert [m["name"] for m in every] == ["lenet", "slow"]
    assert [m["name"] for m in live.grpc.get_inference_statistics(as_json=True)["model_stats"]] == ["lenet", "slow"]
