"""Issue 12's benchmark points: what each new request asks the real app for, which points run, the GPU path on CPU."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
import torch
from fastapi.testclient import TestClient
from safetensors.torch import load as safetensors_load

from bench import gpu
from bench.configs import BASELINE_POINTS, DEFAULT, PREDICT_AND_ACTIVATIONS
from bench.payloads import Payload
from bench.run import Plan, parse_args
from bench.workload import INTROSPECTION_KINDS, JPEG_INTROSPECTION_KINDS, Kind, baseline, build_payloads, make_inputs


@pytest.fixture(scope="module")
def conv_layers(builtin_client: TestClient) -> list[str]:
    layers = builtin_client.get("/models/resnet18/layers").json()["layers"]
    return [layer["name"] for layer in layers if layer["type"] == "Conv2d"]


@pytest.fixture(scope="module")
def payloads(conv_layers: list[str]) -> dict[Kind, Payload]:
    return build_payloads(make_inputs(), conv_layers)


def _post(client: TestClient, payload: Payload) -> tuple[str, bytes]:
    response = client.post(payload.path, content=payload.content, headers=payload.headers)
    assert response.status_code == 200, response.text[:300]
    return response.headers["content-type"], response.content


def test_every_new_request_is_the_cat_jpeg_as_a_multipart_upload(payloads: dict[Kind, Payload]) -> None:
    jpeg = make_inputs().jpeg
    for kind in JPEG_INTROSPECTION_KINDS:
        payload = payloads[kind]
        assert payload.headers["content-type"].startswith("multipart/form-data; boundary=")
        assert jpeg in payload.content
        assert b'name="image"; filename="chelsea.jpg"' in payload.content
        assert baseline(kind, 8, 2) == "e2e-b8-t2"  # compared with the raw decode+forward rows, as /predict JPEG


def test_activations_of_layer4_reduced_by_mean(builtin_client: TestClient, payloads: dict[Kind, Payload]) -> None:
    kind, body = _post(builtin_client, payloads[Kind.ACTIVATIONS_L4_JPEG])
    assert kind.startswith("application/json")
    answer = orjson.loads(body)
    assert list(answer["activations"]) == ["layer4"]
    assert answer["activations"]["layer4"]["output"]["shape"] == [1, 512]


def test_every_conv2d_output_as_safetensors(
    builtin_client: TestClient, payloads: dict[Kind, Payload], conv_layers: list[str]
) -> None:
    kind, body = _post(builtin_client, payloads[Kind.ACTIVATIONS_ALLCONV_ST_JPEG])
    assert kind.startswith("application/octet-stream")
    tensors = safetensors_load(body)
    assert len(conv_layers) == 20
    assert len(tensors) == len(conv_layers)
    assert all(any(key.startswith(layer) for key in tensors) for layer in conv_layers)


def test_gradients_of_layer4_for_the_top1_class_without_the_input(
    builtin_client: TestClient, payloads: dict[Kind, Payload]
) -> None:
    _, body = _post(builtin_client, payloads[Kind.GRADIENTS_L4_JPEG])
    answer = orjson.loads(body)
    assert list(answer["gradients"]) == ["layer4"]  # include_input=false: no "input" key
    assert answer["gradients"]["layer4"]["shape"] == [1, 512, 7, 7]
    _, predicted = _post(builtin_client, payloads[Kind.PREDICT_JPEG_MULTIPART])
    assert answer["targets"] == [orjson.loads(predicted)["predictions"][0]["top_k"][0]["index"]]


def test_saliency_gradcam(builtin_client: TestClient, payloads: dict[Kind, Payload]) -> None:
    _, body = _post(builtin_client, payloads[Kind.SALIENCY_GRADCAM_JPEG])
    answer = orjson.loads(body)
    assert answer["method"] == "gradcam"
    assert len(answer["results"]) == 1


def test_the_default_config_runs_the_new_rows_and_keeps_the_tensor_rows() -> None:
    points = set(DEFAULT.points)
    assert {(kind, c) for kind in JPEG_INTROSPECTION_KINDS for c in (8, 32)} <= points
    assert {(kind, 1) for kind in INTROSPECTION_KINDS} <= points
    assert {(Kind.PREDICT_JPEG_MULTIPART, c) for c in (1, 8, 32)} <= points
    assert DEFAULT.mixes == (PREDICT_AND_ACTIVATIONS,)
    assert PREDICT_AND_ACTIVATIONS.kinds == (Kind.PREDICT_JPEG_MULTIPART, Kind.ACTIVATIONS_L4_JPEG)
    assert (PREDICT_AND_ACTIVATIONS.clients, PREDICT_AND_ACTIVATIONS.seconds) == (8, 20.0)
    assert set(BASELINE_POINTS) == {(Kind.PREDICT_JPEG_MULTIPART, 32), (Kind.ACTIVATIONS_L4_JPEG, 8)}
    assert set(BASELINE_POINTS) <= points  # each before/after pair has its point on this commit


def test_options_shorten_the_new_points_and_refuse_an_unknown_baseline() -> None:
    args = parse_args([])
    assert (args.introspection_duration, args.mixed_duration, args.skip_baseline) == (10.0, None, False)
    plan = Plan(15.0, 10.0, 5000, 120.0, 2, 5, introspection_s=args.introspection_duration)
    assert plan.seconds(Kind.ACTIVATIONS_L4_JPEG) == 10.0
    assert plan.seconds(Kind.PREDICT_JPEG_MULTIPART) == 15.0
    quick = parse_args(["--quick"])
    assert (quick.introspection_duration, quick.mixed_duration) == (3.0, 3.0)
    assert (args.paired_rounds, args.paired_window) == (5, 8.0)
    assert (quick.paired_rounds, quick.paired_window) == (1, 3.0)
    assert parse_args(["--paired-rounds", "0"]).paired_rounds == 0  # skips the paired ratios
    with pytest.raises(SystemExit) as refused:
        parse_args(["--baseline-ref", "no-such-ref-anywhere"])
    assert refused.value.code == 2
    assert parse_args(["--baseline-ref", "no-such-ref-anywhere", "--skip-baseline"]).skip_baseline


def test_the_gpu_points_build_their_payloads_without_cuda() -> None:
    payloads = gpu.gpu_payloads(make_inputs())
    assert set(payloads) == {kind for kind, _ in gpu.POINTS}
    assert (Kind.ACTIVATIONS_L4_JPEG, gpu.CLIENTS) in gpu.POINTS
    activations = payloads[Kind.ACTIVATIONS_L4_JPEG]
    assert activations.path == "/activations"
    assert b'name="model"\r\n\r\nresnet50' in activations.content
    assert b'name="layers"\r\n\r\nlayer4' in activations.content
    assert b'name="reduce"\r\n\r\nmean' in activations.content


def test_gpu_without_cuda_measures_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # also where a GPU exists: never measure here
    lines: list[str] = []
    args = parse_args(["--gpu", "--out", str(tmp_path / "gpu.md")])
    assert gpu.main(args, lines.append) == 0
    assert not (tmp_path / "gpu.md").exists()
    assert "nothing was measured" in lines[0]
