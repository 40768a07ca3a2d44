"""Forward-only captures on ONNX Runtime: a capture set seen `plan_after_requests` times gets a plan built off the
request path; planned answers equal the hooks' (same keys, order, shapes; values within 1e-4) for every capture side
and reduce; models whose plans cannot be built fall back to hooks with the reason in INFO and metrics."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient

from service.config import Settings
from service.main import create_app
from service.registry import capture_graph
from tests.api.test_jobs import run_job, settings_for
from tests.api.test_prediction_path import resnet18_with_statistics
from tests.conftest import ClientFactory, as_tensor, read_binary_answer, tensor_input, wait_settled, write_lenet
from tests.helpers.onnx_rows import count_onnx_rows

TOLERANCE = 1e-4
ADMIN = {"Authorization": "Bearer plans"}
R18 = """
[[models]]
name = "{name}"
source = "torchvision"
architecture = "resnet18"
weights = "r18.pt"
input_size = [3, 32, 32]
max_batch_delay_ms = 1.0
{extra}
"""
SIZED_PY = """
import torch
from torch import nn

class Sized(nn.Module):
    '''Checks its input's rank: ONNX Runtime runs it (the trace reads no tensor's value), FX cannot trace it.'''

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        if x.dim() != 2:
            raise ValueError('Sized takes [N, 4] rows')
        return self.fc(x)
"""
SIZED = """
[[models]]
name = "sized"
source = "python"
architecture = "sized.py:Sized"
input_size = [4]
"""
# every layer of LeNet (pool and relu run several times: `pool#2`, `relu#4`), and resnet18's stem, a reused
# in-place ReLU, a BatchNorm whose output `out += identity` changes in place, a whole stage and the head
LAYERS = {
    "lenet": ["conv1", "pool", "conv2", "fc1", "fc2", "fc3", "relu"],
    "r18": ["bn1", "layer1.0.relu", "layer1.0.bn2", "layer4", "fc"],
}


def lenet_entry(model_dir: Path, name: str, extra: str = "") -> str:
    return write_lenet(model_dir, name).replace("max_batch_delay_ms = 1.0", f"max_batch_delay_ms = 1.0\n{extra}")


@pytest.fixture(scope="module")
def plans_client(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """LeNet and a tiny resnet18, each also served with onnxruntime = false (hooks only: the reference)."""
    root = tmp_path_factory.mktemp("plans")
    torch.save(resnet18_with_statistics().state_dict(), root / "r18.pt")
    config = (
        lenet_entry(root, "lenet")
        + lenet_entry(root, "lenet_eager", "onnxruntime = false")
        + R18.format(name="r18", extra="")
        + R18.format(name="r18_eager", extra="onnxruntime = false")
    )
    (root / "models.toml").write_text(config)
    settings = Settings(
        model_dir=root, config=root / "models.toml", worker_threads=2, capture_plans=16, plan_after_requests=1
    )
    with TestClient(create_app(settings)) as client:
        wait_settled(client)
        yield client


def plans_info(client: TestClient, model: str) -> dict[str, Any]:
    info: dict[str, Any] = client.get(f"/models/{model}").json()["capture_plans"]
    return info


def wait_built(client: TestClient, model: str, count: int = 1) -> dict[str, Any]:
    """INFO's capture_plans once no build runs and `count` plans were built or refused (builds take seconds)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        info = plans_info(client, model)
        if info["building"] == 0 and built(info) >= count:
            return info
        time.sleep(0.1)
    raise TimeoutError(f"{model}'s capture plans were not built")


def built(info: dict[str, Any]) -> int:
    """Plans built (held or evicted since) and refused so far."""
    return len(info["plans"]) + int(info["evicted"]) + len(info["fallbacks"])


def first_sighting(client: TestClient, model: str, x: torch.Tensor, **body: Any) -> dict[str, Any]:
    """Send a capture set the model has not planned yet and wait until its plan (or its fallback) is there."""
    before = plans_info(client, model)
    capture(client, model, x, **body)
    return wait_built(client, model, built(before) + 1)


def capture(client: TestClient, model: str, x: torch.Tensor, **body: Any) -> tuple[dict[str, torch.Tensor], Any]:
    """A safetensors /activations answer: its tensors and its JSON part."""
    request = {"model": model, "inputs": [tensor_input(t) for t in x], "format": "safetensors", **body}
    response = client.post("/activations", json=request)
    assert response.status_code == 200, response.text
    return read_binary_answer(response.content, "safetensors")


def assert_same_answer(got: tuple[dict[str, torch.Tensor], Any], want: tuple[dict[str, torch.Tensor], Any]) -> None:
    tensors, rest = got
    expected, expected_rest = want
    assert sorted(tensors) == sorted(expected)
    assert list(rest["activations"]) == list(expected_rest["activations"])  # keys in the order the hooks fired
    assert rest["activations"] == expected_rest["activations"]  # shapes and dtypes
    for name, t in expected.items():
        torch.testing.assert_close(tensors[name], t, rtol=TOLERANCE, atol=TOLERANCE, msg=name)
    top = [[[c["index"] for c in p["top_k"]] for p in answer["predictions"] or []] for answer in (rest, expected_rest)]
    assert top[0] == top[1]  # none for a model without class scores


def inputs(model: str, batch: int = 2, seed: int = 3) -> torch.Tensor:
    return torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("model", ["lenet", "r18"])
@pytest.mark.parametrize("side", ["output", "input", "both"])
def test_planned_captures_equal_the_hooks_for_every_side_and_reduce(
    plans_client: TestClient, model: str, side: str
) -> None:
    client, x = plans_client, inputs(model)
    for reduce in (None, "mean", "max", "flatten"):  # mean and max inside the graph: a plan each
        body = {"layers": LAYERS[model], "capture": side} | ({"reduce": reduce} if reduce else {})
        if reduce != "flatten":  # flattened after the plan without a reduction
            info = first_sighting(client, model, x, **body)
            planned = {"layers": sorted(LAYERS[model]), "capture": side, "sample_shape": [3, 32, 32], "reduce": reduce}
            assert planned in [{k: v for k, v in p.items() if k not in ("forwards", "nodes")} for p in info["plans"]]
        before = plans_info(client, model)["planned_forwards"]
        assert_same_answer(capture(client, model, x, **body), capture(client, f"{model}_eager", x, **body))
        assert plans_info(client, model)["planned_forwards"] == before + 1
    assert plans_info(client, model)["fallbacks"] == []
    assert plans_info(client, f"{model}_eager")["reason"].startswith("predictions do not run on ONNX Runtime")


def test_reused_modules_numbered_calls_are_planned(plans_client: TestClient) -> None:
    x = inputs("lenet")
    body = {"layers": ["relu"], "capture": "both"}
    first_sighting(plans_client, "lenet", x, **body)
    tensors, rest = capture(plans_client, "lenet", x, **body)
    assert list(rest["activations"]) == ["relu", "relu#2", "relu#3", "relu#4"]
    assert_same_answer((tensors, rest), capture(plans_client, "lenet_eager", x, **body))


def test_requests_never_wait_for_a_plan_being_built(
    make_client: ClientFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started, release = threading.Event(), threading.Event()
    real = capture_graph.build_plan

    def held(*args: Any, **kwargs: Any) -> Any:
        started.set()
        assert release.wait(120)
        return real(*args, **kwargs)

    monkeypatch.setattr("service.registry.capture_plans.build_plan", held)
    client = make_client(lenet_entry(tmp_path, "lenet"), capture_plans=4, plan_after_requests=2)
    x, body = inputs("lenet"), {"layers": ["conv2"], "reduce": "max"}
    try:
        first = capture(client, "lenet", x, **body)
        assert plans_info(client, "lenet")["building"] == 0  # seen once: not yet
        capture(client, "lenet", x, **body)  # seen twice: the build starts, and this request does not wait for it
        assert started.wait(120)
        assert_same_answer(capture(client, "lenet", x, **body), first)  # hooks serve it meanwhile
        info = plans_info(client, "lenet")
        assert (info["building"], info["planned_forwards"], info["eager_forwards"]) == (1, 0, 3)
    finally:
        release.set()
    wait_built(client, "lenet")
    assert_same_answer(capture(client, "lenet", x, **body), first)
    assert plans_info(client, "lenet")["planned_forwards"] == 1


def test_an_untraceable_model_falls_back_to_hooks_with_the_reason(make_client: ClientFactory, tmp_path: Path) -> None:
    (tmp_path / "sized.py").write_text(SIZED_PY)
    client = make_client(SIZED, capture_plans=4, plan_after_requests=1)
    x = torch.arange(8, dtype=torch.float32).reshape(2, 4)
    body = {"model": "sized", "inputs": [tensor_input(t) for t in x], "layers": ["fc"]}
    first = client.post("/activations", json=body).json()
    info = wait_built(client, "sized")
    assert client.get("/models/sized").json()["prediction_path"] == "onnxruntime"
    assert info["plans"] == []
    (fallback,) = info["fallbacks"]
    assert fallback["layers"] == ["fc"]
    assert fallback["reason"].startswith("FX cannot trace it")
    again = client.post("/activations", json=body).json()
    assert again["activations"] == first["activations"]  # hooks serve it, exactly as before
    assert plans_info(client, "sized")["planned_forwards"] == 0
    metrics = client.get("/metrics").text
    assert 'hookserve_capture_plan_fallbacks{model="sized",reason="untraceable"} 1.0' in metrics
    assert 'hookserve_capture_forwards_total{engine="eager",model="sized"} 2.0' in metrics


def test_plans_are_kept_within_the_bound_least_recently_used_first(make_client: ClientFactory, tmp_path: Path) -> None:
    client = make_client(lenet_entry(tmp_path, "lenet"), capture_plans=1, plan_after_requests=1)
    x = inputs("lenet")
    capture(client, "lenet", x, layers=["conv1"])
    wait_built(client, "lenet")
    capture(client, "lenet", x, layers=["conv2"])
    info = wait_built(client, "lenet", 2)  # the second plan, and the first one evicted for it
    assert [plan["layers"] for plan in info["plans"]] == [["conv2"]]
    assert info["evicted"] == 1
    capture(client, "lenet", x, layers=["conv1"])  # evicted: hooks serve it again (and a build starts over)
    assert plans_info(client, "lenet")["eager_forwards"] == 3
    assert 'hookserve_capture_plans{model="lenet"} 1.0' in client.get("/metrics").text


def test_no_plan_outlives_its_model(make_client: ClientFactory, tmp_path: Path) -> None:
    entry = lenet_entry(tmp_path, "lenet")
    client = make_client(entry, capture_plans=4, plan_after_requests=1, admin_token="plans")
    x = inputs("lenet")
    capture(client, "lenet", x, layers=["fc1"])
    wait_built(client, "lenet")
    capture(client, "lenet", x, layers=["fc1"])
    assert plans_info(client, "lenet")["planned_forwards"] == 1
    old = client.app.state.hookserve.fleet.ready("lenet").model.capture_plans  # type: ignore[attr-defined]
    assert client.delete("/models/lenet", headers=ADMIN).status_code == 200
    assert old.size == 0
    assert not old.enabled
    spec = {
        "name": "lenet",
        "source": "python",
        "architecture": "service.zoo.lenet:LeNet",
        "weights": "lenet_digits.pt",
        "input_size": [3, 32, 32],
    }
    assert client.post("/models", json=spec, headers=ADMIN).status_code in (200, 201, 202)
    wait_settled(client)
    capture(client, "lenet", x, layers=["fc1"])
    info = plans_info(client, "lenet")
    assert (info["planned_forwards"], info["eager_forwards"]) == (0, 1)


def test_concurrent_planned_and_eager_requests_each_equal_their_answer_alone(plans_client: TestClient) -> None:
    """Two sample shapes never share a batch: the planned one runs on ONNX Runtime while the other runs on hooks
    beside it (its own plan, built meanwhile from its first sighting, answers within the same tolerance)."""
    client = plans_client
    body = {"layers": ["layer4"], "reduce": "mean"}
    small, large = inputs("r18", 1, seed=5), torch.randn(1, 3, 48, 48, generator=torch.Generator().manual_seed(6))
    first_sighting(client, "r18", small, **body)
    alone = {"planned": capture(client, "r18", small, **body), "eager": capture(client, "r18", large, **body)}
    before = plans_info(client, "r18")
    results: list[tuple[str, Any]] = []
    lock = threading.Lock()

    def client_loop(kind: str) -> None:
        x = small if kind == "planned" else large
        for _ in range(4):
            answer = capture(client, "r18", x, **body)
            with lock:
                results.append((kind, answer))

    threads = [threading.Thread(target=client_loop, args=(kind,)) for kind in ("planned", "eager") * 2]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 16
    for kind, answer in results:
        assert_same_answer(answer, alone[kind])
    # 8 planned requests from 2 threads: 4 batches at least, however they were batched
    assert plans_info(client, "r18")["planned_forwards"] >= before["planned_forwards"] + 4


def test_a_data_set_job_builds_its_plan_from_its_first_chunk(tmp_path: Path) -> None:
    """Bulk work repeats one capture set many times: its plan does not wait for plan_after_requests sightings."""
    settings = settings_for(tmp_path, capture_plans=4, plan_after_requests=1000)
    with TestClient(create_app(settings)) as client:
        wait_settled(client)
        body = {"kind": "unit_stats", "model": "lenet", "dataset": "digits", "layers": ["fc1"], "limit": 64}
        info, result = run_job(client, body)
        assert info["state"] == "succeeded", info
        assert result is not None
        plans = wait_built(client, "lenet")
        assert [(plan["layers"], plan["capture"]) for plan in plans["plans"]] == [(["fc1"], "output")]


def intervene(client: TestClient, model: str, x: torch.Tensor, **body: Any) -> dict[str, Any]:
    request = {"model": model, "inputs": [tensor_input(t) for t in x], "include_logits": True, **body}
    response = client.post("/interventions", json=request)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def logits(answer: dict[str, Any], key: str) -> torch.Tensor:
    return torch.tensor([p["logits"] for p in answer[key]])


def test_the_clean_forward_of_an_intervention_that_reads_no_site_runs_on_the_prediction_path(
    plans_client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = count_onnx_rows(monkeypatch)
    x = inputs("r18", batch=3, seed=11)
    edits = [{"site": "layer3", "op": "scale", "factor": 0.5}]
    got = intervene(plans_client, "r18", x, edits=edits)
    assert rows == [3]  # the clean rows, once; the edited forward needs the hooks
    want = intervene(plans_client, "r18_eager", x, edits=edits)
    assert rows == [3]
    torch.testing.assert_close(logits(got, "clean"), logits(want, "clean"), rtol=TOLERANCE, atol=TOLERANCE)
    torch.testing.assert_close(logits(got, "edited"), logits(want, "edited"), rtol=0, atol=0)
    assert plans_client.get("/models/r18").json()["hooks"] == 0


def test_the_clean_forward_of_an_intervention_that_reads_a_site_takes_that_sites_plan(plans_client: TestClient) -> None:
    x, donor = inputs("lenet", batch=2, seed=12), inputs("lenet", batch=1, seed=13)
    body: dict[str, Any] = {
        "sources": {"donor": [tensor_input(donor[0])]},
        "edits": [{"site": "conv2", "op": "patch", "source": "donor", "channels": [0, 1, 2]}],
        "layers": ["fc3"],
    }
    before = plans_info(plans_client, "lenet")
    intervene(plans_client, "lenet", x, **body)  # its first sighting starts the build (plan_after_requests = 1)
    info = wait_built(plans_client, "lenet", built(before) + 1)
    assert {"layers": ["conv2"], "capture": "output", "sample_shape": [3, 32, 32]} in [
        {k: p[k] for k in ("layers", "capture", "sample_shape")} for p in info["plans"]
    ]
    got = intervene(plans_client, "lenet", x, **body)
    assert plans_info(plans_client, "lenet")["planned_forwards"] == info["planned_forwards"] + 1
    want = intervene(plans_client, "lenet_eager", x, **body)
    for key in ("clean", "edited"):
        torch.testing.assert_close(logits(got, key), logits(want, key), rtol=TOLERANCE, atol=TOLERANCE, msg=key)
    got_fc3, want_fc3 = (as_tensor(a["activations"]["fc3"]["output"]) for a in (got, want))
    torch.testing.assert_close(got_fc3, want_fc3, rtol=TOLERANCE, atol=TOLERANCE)


# functional nodes: the input, a reused ReLU's calls, a residual add that the in-place ReLU after it overwrites
NODES = {
    "lenet": ["x", "relu", "relu_2", "flatten"],
    "r18": ["x", "layer1.0.add", "layer1.0.relu_1", "layer4.1.add", "flatten"],
}


@pytest.mark.parametrize("model", ["lenet", "r18"])
def test_planned_node_captures_equal_the_graphs_for_every_reduce(plans_client: TestClient, model: str) -> None:
    client, x = plans_client, inputs(model, seed=21)
    for reduce in (None, "mean", "max"):
        body = {"nodes": NODES[model]} | ({"reduce": reduce} if reduce else {})
        info = first_sighting(client, model, x, **body)
        planned = {"nodes": sorted(NODES[model]), "capture": "output", "sample_shape": [3, 32, 32], "reduce": reduce}
        assert planned in [{k: v for k, v in p.items() if k not in ("forwards", "layers")} for p in info["plans"]]
        assert_same_answer(capture(client, model, x, **body), capture(client, f"{model}_eager", x, **body))
        assert plans_info(client, model)["planned_forwards"] == info["planned_forwards"] + 1
    assert plans_info(client, model)["fallbacks"] == []


def test_the_clean_forward_of_an_intervention_at_a_node_takes_the_nodes_plan(plans_client: TestClient) -> None:
    x = inputs("r18", batch=3, seed=22)
    body: dict[str, Any] = {"edits": [{"node": "layer2.0.add", "op": "mean", "over": "batch"}], "nodes": ["flatten"]}
    before = plans_info(plans_client, "r18")
    intervene(plans_client, "r18", x, **body)
    info = wait_built(plans_client, "r18", built(before) + 1)
    assert {"nodes": ["layer2.0.add"], "capture": "output", "sample_shape": [3, 32, 32]} in [
        {k: p[k] for k in ("nodes", "capture", "sample_shape")} for p in info["plans"] if "nodes" in p
    ]
    got = intervene(plans_client, "r18", x, **body)
    assert plans_info(plans_client, "r18")["planned_forwards"] == info["planned_forwards"] + 1
    want = intervene(plans_client, "r18_eager", x, **body)
    for key in ("clean", "edited"):
        torch.testing.assert_close(logits(got, key), logits(want, key), rtol=TOLERANCE, atol=TOLERANCE, msg=key)


def v2_infer(client: TestClient, model: str, x: torch.Tensor, outputs: list[str]) -> dict[str, torch.Tensor]:
    body = {
        "inputs": [{"name": "input__0", "shape": list(x.shape), "datatype": "FP32", "data": x.flatten().tolist()}],
        "outputs": [{"name": name} for name in outputs],
    }
    response = client.post(f"/v2/models/{model}/infer", json=body)
    assert response.status_code == 200, response.text
    return {o["name"]: torch.tensor(o["data"]).reshape(o["shape"]) for o in response.json()["outputs"]}


def test_v2_layer_outputs_run_on_their_plan(plans_client: TestClient) -> None:
    x, outputs = inputs("lenet", seed=23), ["output__0", "conv1", "relu#3"]
    before = plans_info(plans_client, "lenet")
    v2_infer(plans_client, "lenet", x, outputs)
    info = wait_built(plans_client, "lenet", built(before) + 1)
    assert {"layers": ["conv1", "relu"], "capture": "output", "sample_shape": [3, 32, 32]} in [
        {k: p[k] for k in ("layers", "capture", "sample_shape")} for p in info["plans"]
    ]
    got = v2_infer(plans_client, "lenet", x, outputs)
    assert plans_info(plans_client, "lenet")["planned_forwards"] == info["planned_forwards"] + 1
    want = v2_infer(plans_client, "lenet_eager", x, outputs)
    assert list(got) == outputs
    for name in outputs:
        torch.testing.assert_close(got[name], want[name], rtol=TOLERANCE, atol=TOLERANCE, msg=name)


# the built-in registry: a layer set per model, and why it gets no plan where it gets none (None: it gets one)
NO_ONNX = "predictions do not run on ONNX Runtime"  # timm's ViTs format a traced size: no export, so no plans
BUILTIN_LAYERS = {
    "lenet": (["conv2", "relu"], None),
    "resnet18": (["layer1.0", "layer4"], None),
    "efficientvit_b0": (["stem_res0"], "FX cannot trace it"),  # data-dependent control flow: hooks serve it
    "vit_digits": (["blocks.1", "blocks.3.attn"], NO_ONNX),
    "vit_tiny": (["blocks.0", "norm"], NO_ONNX),
}


@pytest.fixture(scope="module")
def builtin_plans_client(tmp_path_factory: pytest.TempPathFactory) -> Any:
    settings = Settings(
        model_dir=tmp_path_factory.mktemp("builtin-plans"), worker_threads=2, capture_plans=16, plan_after_requests=1
    )
    with TestClient(create_app(settings)) as client:
        wait_settled(client)
        yield client


@pytest.mark.parametrize("model", list(BUILTIN_LAYERS))
def test_every_built_in_model_gets_plans_equal_to_its_hooks_or_falls_back_with_the_reason(
    builtin_plans_client: TestClient, model: str
) -> None:
    client = builtin_plans_client
    size = client.get(f"/models/{model}").json()["input_size"]
    x = torch.randn(2, *size, generator=torch.Generator().manual_seed(31))
    layers, refusal = BUILTIN_LAYERS[model]
    sets: list[dict[str, Any]] = [{"layers": layers, "capture": "both"}, {"layers": layers, "reduce": "mean"}]
    nodes = client.get(f"/models/{model}/nodes")
    if nodes.status_code == 200:  # a few functional nodes and the last one
        listed = nodes.json()["nodes"]
        functional = [n["name"] for n in listed if n["op"] == "call_function"]
        sets.append({"nodes": [*functional[:2], listed[-1]["name"]]})
    for body in sets:
        hooked = capture(client, model, x, **body)  # the first sighting: hooks, while its plan is built
        info = wait_built(client, model, built(plans_info(client, model)))
        planned_before = info["planned_forwards"]
        again = capture(client, model, x, **body)
        assert_same_answer(again, hooked)
        after = plans_info(client, model)
        if refusal is None:
            assert after["planned_forwards"] == planned_before + 1, body
        else:
            assert after["planned_forwards"] == planned_before
            reasons = [after["reason"] or "", *(f["reason"] for f in after["fallbacks"])]
            assert any(refusal in reason for reason in reasons), reasons
    assert client.get(f"/models/{model}").json()["hooks"] == 0
