"""Start-up errors a person can read: one line per problem with the closest valid value, exit status 2.

`hookserve check` and `python -m service` run the same validation; the server starts nothing
when it fails (no uvicorn, no traceback).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from service.config_check import check
from service.zoo.vit import vit_weights_path
from tests.cli.conftest import Hookserve, run_process
from tests.conftest import write_lenet
from tests.reliability.live_server import REPO_ROOT, free_port, write_slow

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
    port = free_port()
    good = hookserve("check", "--config", "good.toml", "--model-dir", tmp_path, "--port", port)
    assert (good.status, good.out) == (0, "ok: good.toml (lenet)\n")
    builtin = hookserve("check", "--port", port)
    assert builtin.out == "ok: built-in models (lenet, resnet18, efficientvit_b0, vit_digits, vit_tiny)\n"


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


LENET = """
[[models]]
name = "lenet"
source = "python"
architecture = "service.zoo.lenet:LeNet"
weights = "lenet_digits.pt"
"""
SIZE = "input_size = [3, 32, 32]\n"


def thorough(tmp_path: Path, text: str, *flags: object) -> list[str]:
    """`hookserve check` as its own process: the lines it prints (exit status 2 asserted when there are any)."""
    (tmp_path / "models.toml").write_text(text)
    done = run_process(
        "check", "--config", "models.toml", "--model-dir", tmp_path, "--port", free_port(), *flags, cwd=tmp_path
    )
    assert done.status == (2 if done.out.strip() and not done.out.startswith("ok:") else 0), done.err
    return done.out.splitlines()


def test_check_builds_each_model_on_the_meta_device(tmp_path: Path) -> None:
    write_lenet(tmp_path)
    text = (
        '[[models]]\nname = "r"\nsource = "torchvision"\narchitecture = "resnet18"\nkwargs = { num_clases = 10 }\n'
        + LENET.replace('"lenet"', '"small"') + "input_size = [3, 224]\n"
        + LENET.replace('"lenet"', '"mixed"').replace("lenet_digits.pt", "vit.safetensors") + SIZE
    )  # fmt: skip
    shutil.copyfile(vit_weights_path(), tmp_path / "vit.safetensors")
    assert thorough(tmp_path, text) == [
        "models.toml: models[0] (r).kwargs: building it fails: ResNet.__init__() got an unexpected keyword argument "
        "'num_clases'",
        "models.toml: models[1] (small).input_size: a forward on zeros of shape [1, 3, 224] fails (Invalid channel "
        "dimensions); fix input_size",
        "models.toml: models[2] (mixed).weights: vit.safetensors does not match the architecture: 10 missing keys "
        "(conv1.weight, conv1.bias, conv2.weight, ...); 56 unexpected keys (blocks.0.attn.proj.bias, "
        "blocks.0.attn.proj.weight, blocks.0.attn.qkv.bias, ...)",
    ]
    assert thorough(tmp_path, LENET + SIZE) == ["ok: models.toml (lenet)"]
    assert thorough(tmp_path, LENET) == [  # loading would warm it up at 224 x 224, and fail
        "models.toml: models[0] (lenet).input_size: a forward on zeros of shape [1, 3, 224, 224] fails (a and b must "
        "have same reduction dim, but got [1, 44944] X [400, 120].); set input_size in the model's config"
    ]


def test_check_refuses_an_empty_toml_a_missing_dir_a_bad_host_and_a_taken_port(tmp_path: Path) -> None:
    assert thorough(tmp_path, "") == ["models.toml: holds no [[models]] entries: the server would serve no model"]
    (tmp_path / "models.toml").write_text(write_lenet(tmp_path))
    missing = run_process("check", "--config", "models.toml", "--model-dir", tmp_path / "none", cwd=tmp_path)
    assert (missing.status, missing.out.splitlines()[-1]) == (
        2,
        f"models.toml: the model dir {str(tmp_path / 'none')!r} (--model-dir / HOOKSERVE_MODEL_DIR) is not a directory",
    )
    host = run_process("check", "--host", "no-such-host.invalid", "--port", free_port())
    assert host.status == 2
    assert host.out.startswith("--host: 'no-such-host.invalid' is not a host name or address (")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = run_process("check", "--port", port)
    assert (busy.status, busy.out) == (2, f"--port: {port} is in use on 127.0.0.1; choose another port\n")


def test_hints_name_the_right_file_and_table(tmp_path: Path) -> None:
    write_lenet(tmp_path)
    text = LENET + 'labels = "digit_labels.txt"\ninterpolation = "bilinear"\n'
    lines = problems(tmp_path, text)
    assert lines == [
        f"models.toml: models[0] (lenet).labels: no labels file 'digit_labels.txt' under the model dir "
        f"{str(tmp_path)!r}; did you mean 'digits_labels.txt'?",
        "models.toml: models[0] (lenet).interpolation: unknown field here; 'interpolation' belongs under "
        "[models.preprocess]",
    ]


def test_a_missing_config_is_answered_before_the_server_is_imported(tmp_path: Path) -> None:
    probe = (
        "import sys\nimport service.__main__ as entry\ntry:\n    entry.main(['--config', 'none.toml'])\n"
        "except SystemExit as exc:\n    print(exc.code, 'torch' in sys.modules, 'fastapi' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.stdout == "2 False False\n"
    assert done.stderr == "none.toml: no such file (--config / HOOKSERVE_CONFIG)\n"


def test_the_server_refuses_a_taken_port_a_missing_dir_and_one_port_twice_before_importing_torch(
    tmp_path: Path,
) -> None:
    """The server runs check's own address and directory checks at start-up: exit 2 with the line, not 3 from
    uvicorn after the whole app was imported, and no gRPC server sharing a taken port through SO_REUSEPORT."""
    probe = (
        "import sys\nimport service.__main__ as entry\ntry:\n    entry.main(sys.argv[1:])\n"
        "except SystemExit as exc:\n    print(exc.code, 'torch' in sys.modules)\n"
    )

    def start(*flags: object, **env: str) -> tuple[str, str]:
        done = subprocess.run(
            [sys.executable, "-c", probe, *map(str, flags)], cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **env}, capture_output=True, text=True, timeout=120,
            check=False,
        )  # fmt: skip
        return done.stdout, done.stderr

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert start("--port", port) == ("2 False\n", f"--port: {port} is in use on 127.0.0.1; choose another port\n")
        free = free_port()
        assert start("--port", free, HOOKSERVE_GRPC_PORT=str(port)) == (
            "2 False\n",
            f"HOOKSERVE_GRPC_PORT: {port} is in use on 127.0.0.1; choose another port\n",
        )
    assert start("--port", free, HOOKSERVE_TORCHSERVE_MANAGEMENT_PORT=str(free)) == (
        "2 False\n",
        f"HOOKSERVE_TORCHSERVE_MANAGEMENT_PORT: {free} is also --port; give each its own port\n",
    )
    assert start("--port", free, "--model-dir", tmp_path / "none") == (
        "2 False\n",
        f"--model-dir: {str(tmp_path / 'none')!r} is not a directory\n",
    )
