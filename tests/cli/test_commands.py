"""The `hookserve` commands against a live server: tables for a person, JSON for scripts, files on request."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from safetensors.numpy import load_file

from service.cli.main import build_parser, command_names
from service.client import Client
from service.zoo.lenet import samples_dir, weights_path
from tests.cli.conftest import Hookserve
from tests.client.servers import TOKEN
from tests.reliability.live_server import REPO_ROOT, LiveServer

DIGIT_7 = samples_dir() / "digit_7.png"
DIGIT_3 = samples_dir() / "digit_3.png"


@pytest.fixture
def url(live: LiveServer, monkeypatch: pytest.MonkeyPatch) -> str:
    """The server's address, given the way a person would: HOOKSERVE_URL."""
    monkeypatch.setenv("HOOKSERVE_URL", live.base_url)
    monkeypatch.delenv("HOOKSERVE_ADMIN_TOKEN", raising=False)
    return live.base_url


def test_predict_prints_a_table_and_json(hookserve: Hookserve, url: str) -> None:
    table = hookserve("predict", "lenet", DIGIT_7, DIGIT_3, "-k", "2")
    assert table.status == 0, table.err
    lines = table.out.splitlines()
    assert lines[0].split() == ["input", "rank", "label", "index", "score"]
    assert [line.split()[:3] for line in lines[2:]] == [
        [str(DIGIT_7), "1", "7"],
        [str(DIGIT_7), "2", "8"],
        [str(DIGIT_3), "1", "3"],
        [str(DIGIT_3), "2", "5"],
    ]
    answer = json.loads(hookserve("predict", "lenet", DIGIT_7, "--json", "--logits").out)
    with Client(url) as client:
        expected = client.predict("lenet", DIGIT_7, include_logits=True)
    assert answer["inputs"] == [str(DIGIT_7)]
    assert answer["predictions"][0]["top_k"][0] == {
        "index": 7,
        "label": "7",
        "score": expected.predictions[0].top1.score,
    }
    assert answer["predictions"][0]["logits"] == expected.predictions[0].logits


def test_npy_files_are_tensor_inputs(hookserve: Hookserve, url: str, tmp_path: Path) -> None:
    x = np.random.default_rng(1).standard_normal((3, 32, 32)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    answer = json.loads(hookserve("predict", "lenet", tmp_path / "x.npy", "--json").out)
    with Client(url) as client:
        assert answer["predictions"][0]["top_k"][0]["index"] == client.predict("lenet", x).predictions[0].top1.index


def test_activations_stats_table_and_files(hookserve: Hookserve, url: str, tmp_path: Path) -> None:
    table = hookserve("activations", "lenet", DIGIT_7, "-l", "conv1,fc3")
    assert table.status == 0, table.err
    rows = [line.split()[:2] for line in table.out.splitlines()[2:]]
    assert rows == [["conv1", "output"], ["fc3", "output"]]
    with Client(url) as client:
        expected = client.activations("lenet", [DIGIT_7, DIGIT_3], ["conv1", "fc3"], capture="both", reduce="mean")
    out = tmp_path / "acts.safetensors"
    written = hookserve(
        "activations", "lenet", DIGIT_7, DIGIT_3, "-l", "conv1", "-l", "fc3", "--capture", "both", "--reduce", "mean",
        "-o", out,
    )  # fmt: skip
    assert written.status == 0, written.err
    assert written.out.splitlines()[-1] == f"wrote {out}"
    tensors = load_file(str(out))
    assert set(tensors) == set(expected.flat())
    for key, array in expected.flat().items():
        np.testing.assert_array_equal(tensors[key], array)
    npz = tmp_path / "acts.npz"
    assert hookserve("activations", "lenet", DIGIT_7, "-l", "conv1", "-o", npz, "--json").status == 0
    with np.load(npz, allow_pickle=False) as data:
        assert json.loads(str(data["__response__"]))["model"] == "lenet"
        assert data["conv1:output"].shape == (1, 6, 28, 28)
    png = tmp_path / "conv1.png"
    assert hookserve("activations", "lenet", DIGIT_7, "-l", "conv1", "-o", png).status == 0
    with Image.open(png) as image:
        assert image.format == "PNG"


def test_saliency_table_png_and_arrays(hookserve: Hookserve, url: str, tmp_path: Path) -> None:
    table = hookserve("saliency", "lenet", DIGIT_7, DIGIT_3, "-m", "integrated_gradients", "--steps", "8", "-t", "7,3")
    assert table.status == 0, table.err
    rows = [line.split()[:3] for line in table.out.splitlines()[2:]]
    assert rows == [[str(DIGIT_7), "7", "7"], [str(DIGIT_3), "3", "3"]]
    png = tmp_path / "gradcam.png"
    assert hookserve("saliency", "lenet", DIGIT_7, "-m", "gradcam", "-o", png).status == 0
    with Image.open(png) as image:
        assert image.size[0] >= 224
    arrays = tmp_path / "saliency.safetensors"
    assert hookserve("saliency", "lenet", DIGIT_7, "-o", arrays).status == 0
    with Client(url) as client:
        expected = client.saliency("lenet", DIGIT_7)
    tensors = load_file(str(arrays))
    np.testing.assert_array_equal(tensors["0:attribution"], expected.results[0].attribution)
    np.testing.assert_array_equal(tensors["0:heatmap"], expected.results[0].heatmap)


def test_saliency_takes_any_server_method_and_its_parameters(hookserve: Hookserve, url: str) -> None:
    occlusion = hookserve(
        "saliency", "lenet", DIGIT_7, "-m", "occlusion", "-p", "window=[8,8]", "-p", "strides=[4,4]", "--json"
    )
    assert occlusion.status == 0, occlusion.err
    answer = json.loads(occlusion.out)
    assert answer["method"] == "occlusion"
    assert answer["results"][0]["target"] == 7
    unknown = hookserve("saliency", "lenet", DIGIT_7, "-m", "tarot")
    assert unknown.status != 0
    assert "method: Input should be one of gradient" in unknown.err
    usage = hookserve("saliency", "lenet", DIGIT_7, "-m", "occlusion", "-p", "window")
    assert usage.status == 2
    assert usage.err.splitlines()[-1] == "hookserve: error: argument -p/--param: takes KEY=VALUE (got 'window')"


def test_layers_summary_models_and_inspect(hookserve: Hookserve, url: str) -> None:
    layers = hookserve("layers", "lenet")
    assert [line.split()[0] for line in layers.out.splitlines()[2:]] == [
        "(root)", "conv1", "pool", "conv2", "fc1", "fc2", "fc3", "relu",
    ]  # fmt: skip
    assert "Total params: 62,006" in hookserve("summary", "lenet", "--depth", "1").out
    assert json.loads(hookserve("summary", "lenet", "--json").out)["total_params"] == 62006
    models = hookserve("models").out.splitlines()
    assert [line.split()[:2] for line in models[2:]] == [["lenet", "ready"], ["slow", "ready"], ["vit_digits", "ready"]]
    detail = hookserve("models", "lenet")
    assert "LeNet(" in detail.out
    inspected = hookserve("inspect", weights_path(), "--compare-to", "lenet")
    assert inspected.status == 0, inspected.err
    assert "state dict model_state_dict: 10 tensors, 62006 values" in inspected.out
    assert "missing keys: 0" in inspected.out
    on_server = json.loads(hookserve("inspect", "lenet_digits.pt", "--server-path", "--stats", "--json").out)
    assert on_server["state_dicts"]["model_state_dict"]["entries"][0]["nan_count"] == 0


def test_load_and_unload_take_the_token_from_the_environment(
    hookserve: Hookserve, url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = tmp_path / "more.toml"
    spec.write_text(
        '[[models]]\nname = "slow3"\nsource = "python"\narchitecture = "slow.py:Slow"\ninput_size = [1, 4, 4]\n'
    )
    denied = hookserve("load", spec)
    assert (denied.status, denied.err) == (
        3,
        "hookserve: error: 401 admin call needs 'Authorization: Bearer <token>'\n",
    )
    monkeypatch.setenv("HOOKSERVE_ADMIN_TOKEN", TOKEN)
    loaded = hookserve("load", spec)  # waits until ready, as TorchServe's register does
    assert loaded.status == 0, loaded.err
    assert loaded.out.splitlines()[2].split()[:2] == ["slow3", "ready"]
    assert hookserve("unload", "slow3").out == "unloaded slow3\n"
    started = hookserve("load", spec, "--no-wait", "--json")
    assert started.status == 0, started.err
    assert json.loads(started.out)[0]["status"] in ("loading", "ready")
    with Client(url, token=TOKEN) as client:
        client.wait_for_model("slow3", timeout=120)
    assert hookserve("unload", "slow3").status == 0


def test_errors_are_one_line_with_their_exit_status(hookserve: Hookserve, url: str, tmp_path: Path) -> None:
    missing = hookserve("predict", "nope", DIGIT_7)
    assert (missing.status, missing.out) == (3, "")
    assert missing.err == "hookserve: error: 404 no model named 'nope'; `hookserve models` lists them\n"
    layer = hookserve("activations", "lenet", DIGIT_7, "-l", "convv1")
    assert layer.status == 3
    assert layer.err.startswith("hookserve: error: 422 unknown layer 'convv1'; closest: 'conv1'")
    gone = hookserve("predict", "lenet", DIGIT_7, "--url", "http://127.0.0.1:9", "--retries", "0")
    assert gone.status == 4
    assert gone.err.startswith("hookserve: error: no answer from http://127.0.0.1:9: ")
    unreadable = hookserve("predict", "lenet", tmp_path / "none.png")
    assert unreadable.status == 1
    assert "No such file" in unreadable.err
    suffix = hookserve("activations", "lenet", DIGIT_7, "-l", "conv1", "-o", tmp_path / "x.txt")
    assert suffix.status == 2
    assert suffix.err == "hookserve: error: -o must end in .safetensors, .npz, .png (got 'x.txt')\n"


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    for command in command_names():
        assert f"    {command}" in text


def test_the_hookserve_script_is_the_cli() -> None:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["hookserve"] == "service.cli.main:main"
    assert any(dep.startswith("httpx") for dep in project["dependencies"])
    assert any(dep.startswith("tqdm") for dep in project["dependencies"])


def test_attention_table_png_and_arrays(hookserve: Hookserve, url: str, tmp_path: Path) -> None:
    table = hookserve("attention", "vit_digits", DIGIT_7, "-b", "blocks.3", "--heads", "0,1", "--top", "2")
    assert table.status == 0, table.err
    lines = table.out.splitlines()
    assert lines[0].split() == ["input", "block", "head", "query", "most", "attended", "(probability)"]
    assert len(lines) == 2 + 2  # a row per head
    assert "blocks.3.attn" in lines[2]
    assert " cls " in lines[2]
    png = hookserve("attention", "vit_digits", DIGIT_7, "-b", "blocks.0,blocks.1", "-o", tmp_path / "maps.png")
    assert png.status == 0, png.err
    with Image.open(tmp_path / "maps.png") as image:
        assert image.size == (4 * 128 + 6, 2 * 128 + 2)
    arrays = hookserve("attention", "vit_digits", DIGIT_7, DIGIT_3, "-q", "all", "-o", tmp_path / "maps.safetensors")
    assert arrays.status == 0, arrays.err
    assert load_file(tmp_path / "maps.safetensors")["blocks.2.attn"].shape == (2, 4, 65, 65)
    as_json = json.loads(hookserve("attention", "vit_digits", DIGIT_7, "-b", "blocks.0", "--json").out)
    assert as_json["query_names"] == ["cls"]
    refused = hookserve("attention", "lenet", DIGIT_7)
    assert refused.status == 3
    assert "lenet has no attention modules" in refused.err


def test_activations_keep_a_vision_transformers_tokens(hookserve: Hookserve, url: str) -> None:
    found = hookserve("activations", "vit_digits", DIGIT_7, "-l", "blocks.1", "--tokens", "0,5", "--json")
    assert found.status == 0, found.err
    assert json.loads(found.out)["stats"]["blocks.1"]["output"]["shape"] == [1, 2, 64]
