"""Start-up errors a person can read: one line per problem with the closest valid value, exit status 2.

`hookserve check` and `python -m service` run the same validation; the server starts nothing
when it fails (no uvicorn, no traceback).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from service.config_check import check
from tests.cli.conftest import Hookserve
from tests.conftest import write_lenet
from tests.reliability.live_server import REPO_ROOT, write_slow

TYPO = """
[[models]]
name = "x"
source = "torvision"
architecture = "resnet18"
"""


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("CONFIG", "MODEL_DIR", "HOST", "PORT", "DEVICE", "ALLOW_DOWNLOADS"):
        monkeypatch.delenv(f"HOOKSERVE_{name}", raising=False)


def problems(tmp_path: Path, text: str, **flags: object) -> list[str]:
    (tmp_path / "models.toml").write_text(text)
    result = check({"config": Path("models.toml"), "model_dir": tmp_path, **flags})
    return [str(p) for p in result.problems]


@pytest.fixture(autouse=True)
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the config is named as the person typed it: models.toml


def test_the_issue_typo_is_one_line_with_the_closest_source(tmp_path: Path) -> None:
    assert problems(tmp_path, TYPO) == [
        "models.toml: models[0] (x).source: 'torvision' is not one of torchvision, timm, python, torchscript; "
        "did you mean 'torchvision'?"
    ]


def test_every_problem_of_an_entry_is_named(tmp_path: Path) -> None:
    (tmp_path / "resnet18.pth").write_bytes(b"")
    (tmp_path / "imagenet.txt").write_text("a\n")
    text = """
[[models]]
name = "y"
source = "torchvision"
architecture = "resnt18"
wieghts = "resnet18.pth"
labels = "imagenet.tx"
dtype = "float"
input_size = [3, 0, 224]
[models.preprocess]
interpolation = "bilinar"
[models.optimizer]
type = "SDG"

[[models]]
name = "y"
source = "timm"
architecture = "efficientvit_b00"
weights = "DEFAULT"

[[models]]
name = "bad name"
source = "python"
architecture = "Net"

[[modles]]
name = "z"
"""
    found = problems(tmp_path, text)
    expected = [  # in the file's order
        "models.toml: modles: unknown top-level key; the file holds [[models]] entries; did you mean 'models'?",
        "models.toml: models[0] (y).architecture: torchvision has no model 'resnt18'; did you mean 'resnet18'?",
        "models.toml: models[0] (y).wieghts: unknown field; did you mean 'weights'?",
        f"models.toml: models[0] (y).labels: no labels file 'imagenet.tx' under the model dir {str(tmp_path)!r}; "
        "did you mean 'imagenet.txt'?",
        "models.toml: models[0] (y).dtype: 'float' is not one of float32, float16, bfloat16; did you mean 'float32'?",
        "models.toml: models[0] (y).input_size: input_size values must be positive (got [3, 0, 224])",
        "models.toml: models[0] (y).preprocess.interpolation: 'bilinar' is not one of bilinear, bicubic, nearest; "
        "did you mean 'bilinear'?",
        "models.toml: models[0] (y).optimizer.type: torch.optim has no optimizer 'SDG'; did you mean 'SGD'?",
        "models.toml: models[1] (y).name: 'y' is already the name of models[0]",
        "models.toml: models[1] (y).architecture: timm has no model 'efficientvit_b00'; "
        "did you mean 'efficientvit_b0'?",
        "models.toml: models[1] (y).weights: 'DEFAULT' needs downloads, which are disabled; set "
        "HOOKSERVE_ALLOW_DOWNLOADS=true or point weights at a file under the model dir",
        "models.toml: models[2] (bad name).name: 'bad name' is not a URL-safe name (a letter or digit, then letters, "
        "digits, '_', '.', '-'; at most 64)",
        "models.toml: models[2] (bad name).architecture: 'Net' must be 'pkg.module:ClassName' or 'file.py:ClassName' "
        "(a file under the model dir)",
    ]
    assert found == expected


def test_a_missing_weights_file_names_the_closest_file(tmp_path: Path) -> None:
    config = write_lenet(tmp_path).replace('weights = "lenet_digits.pt"', 'weights = "lenet_digit.pt"')
    assert problems(tmp_path, config) == [
        f"models.toml: models[0] (lenet).weights: no weights file 'lenet_digit.pt' under the model dir "
        f"{str(tmp_path)!r}; did you mean 'lenet_digits.pt'?"
    ]


def test_paths_outside_the_model_dir_are_problems_too(tmp_path: Path) -> None:
    text = '[[models]]\nname = "a"\nsource = "python"\narchitecture = "../evil.py:Net"\n'
    (found,) = problems(tmp_path, text)
    assert found.startswith("models.toml: models[0] (a).architecture: ")
    assert "outside the model dir" in found


def test_a_valid_config_has_no_problems(tmp_path: Path) -> None:
    assert problems(tmp_path, write_lenet(tmp_path) + write_slow(tmp_path)) == []


def test_a_missing_model_dir_is_one_problem(tmp_path: Path) -> None:
    found = problems(tmp_path, write_lenet(tmp_path), model_dir=tmp_path / "nowhere")
    assert found == [
        f"models.toml: the model dir {str(tmp_path / 'nowhere')!r} (--model-dir / HOOKSERVE_MODEL_DIR) "
        "is not a directory"
    ]


def test_bad_port_and_devices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert [str(p) for p in check({"port": 70000}).problems] == ["--port: 70000 is not a port (1 to 65535)"]
    monkeypatch.setenv("HOOKSERVE_PORT", "eighty")
    assert [str(p) for p in check({}).problems] == ["HOOKSERVE_PORT: 'eighty' is not an integer"]
    monkeypatch.delenv("HOOKSERVE_PORT")
    assert [str(p) for p in check({"device": "gpu"}).problems] == [
        "--device: 'gpu' is not a device; use auto, cpu, cuda, cuda:N or mps; did you mean 'cpu'?"
    ]
    absent = f"cuda:{torch.cuda.device_count()}"  # one past the last GPU, or any GPU on a machine without
    (found,) = [str(p) for p in check({"device": absent}).problems]
    assert found.startswith(f"--device: {absent!r} is not there: ")
    entry = (
        f'[[models]]\nname = "a"\nsource = "python"\narchitecture = "service.zoo.lenet:LeNet"\ndevice = "{absent}"\n'
    )
    (found,) = problems(tmp_path, entry)
    assert found.startswith(f"models.toml: models[0] (a).device: {absent!r} is not there: ")


def test_a_toml_syntax_error_names_the_line(tmp_path: Path) -> None:
    (found,) = problems(tmp_path, '[[models]]\nname = "a\n')
    assert found.startswith("models.toml: not valid TOML: ")
    assert "line 2" in found
    assert check({"config": tmp_path / "none.toml"}).problems[0].message.startswith("no such file")


def test_hookserve_check_exit_status_and_output(hookserve: Hookserve, tmp_path: Path) -> None:
    (tmp_path / "models.toml").write_text(TYPO)
    bad = hookserve("check", "--config", "models.toml", "--model-dir", tmp_path)
    assert bad.status == 2
    assert bad.out.splitlines() == [
        "models.toml: models[0] (x).source: 'torvision' is not one of torchvision, timm, python, torchscript; "
        "did you mean 'torchvision'?"
    ]
    as_json = hookserve("check", "--config", "models.toml", "--model-dir", tmp_path, "--json")
    assert as_json.status == 2
    assert '"where": "models.toml: models[0] (x).source"' in as_json.out
    (tmp_path / "good.toml").write_text(write_lenet(tmp_path))
    good = hookserve("check", "--config", "good.toml", "--model-dir", tmp_path)
    assert (good.status, good.out) == (0, "ok: good.toml (lenet)\n")
    assert hookserve("check").out == "ok: built-in models\n"


def test_python_m_service_exits_2_with_the_lines_and_no_traceback(tmp_path: Path) -> None:
    (tmp_path / "models.toml").write_text(TYPO + write_lenet(tmp_path).replace('"lenet_digits.pt"', '"lenet_digit.pt"'))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HOOKSERVE_PORT": "99999"}
    for command in (["-m", "service"], ["-m", "service.cli", "serve"], ["-m", "service.cli"]):
        done = subprocess.run(
            [sys.executable, *command, "--config", "models.toml", "--model-dir", str(tmp_path)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 2, done.stderr
        assert done.stderr.splitlines() == [
            "HOOKSERVE_PORT: 99999 is not a port (1 to 65535)",
            "models.toml: models[0] (x).source: 'torvision' is not one of torchvision, timm, python, torchscript; "
            "did you mean 'torchvision'?",
            f"models.toml: models[1] (lenet).weights: no weights file 'lenet_digit.pt' under the model dir "
            f"{str(tmp_path)!r}; did you mean 'lenet_digits.pt'?",
        ]
        assert "Traceback" not in done.stderr
        assert done.stdout == ""
