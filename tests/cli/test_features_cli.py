"""`hookserve features` as a person runs it: Ctrl-C keeps what is written, the same command resumes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file
from sklearn.datasets import load_digits

from service.cli.features import Bar, summary_lines
from service.client.features import ExtractionReport, FeatureIndex, extract_features, read_features
from service.client.features.store import digest
from tests.cli.conftest import Hookserve
from tests.client.servers import digit_png
from tests.reliability.live_server import REPO_ROOT, LiveServer

# A model that takes 50 ms per image, so that a run can be interrupted half way.
SLEEPY = """\
import time

import torch
from torch import nn


class Sleepy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(1, 4, 3)
        self.head = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.05 * x.shape[0])
        return self.head(self.conv(x).mean(dim=(2, 3)))
"""
SLEEPY_TOML = """
[[models]]
name = "sleepy"
source = "python"
architecture = "sleepy.py:Sleepy"
input_size = [1, 8, 8]
max_batch_size = 1
[models.preprocess]
resize = 8
crop = 8
mean = [0.5]
std = [0.25]
grayscale = true
"""
IMAGES = 48
# `python -m service.cli ...` with SIGINT's default handler and an empty signal mask, as a terminal's shell starts it.
# A test run started in the background (`make test &`) inherits SIGINT ignored, which Python then leaves ignored.
AS_FROM_A_TERMINAL = """\
import runpy, signal, sys
signal.pthread_sigmask(signal.SIG_SETMASK, [])
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.argv = sys.argv[2:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""
OPTIONS = ["-l", "conv", "--reduce", "mean", "--shard-size", "8", "-b", "4", "-c", "1", "--no-progress"]


@pytest.fixture(scope="module")
def sleepy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    model_dir = tmp_path_factory.mktemp("sleepy-models")
    (model_dir / "sleepy.py").write_text(SLEEPY)
    with LiveServer(model_dir, SLEEPY_TOML) as server:
        yield server


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("images")
    for i, values in enumerate(load_digits().data[:IMAGES]):
        digit_png(values, directory / f"{i:03d}.png")
    return directory


def files_of(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def done_shards(out: Path) -> int:
    try:
        return sum(s.done for s in FeatureIndex.load(out).shards)
    except (OSError, ValueError):
        return 0


def test_ctrl_c_keeps_the_written_shards_and_the_same_command_resumes(
    sleepy: LiveServer, images: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    command = [sys.executable, "-m", "service.cli", "features", "sleepy", str(images), "-o", str(out), *OPTIONS]
    command += ["--url", sleepy.base_url]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    # As from a terminal: Ctrl-C neither ignored nor blocked, whatever this test process inherited or set up
    # (a child inherits an ignored SIGINT and a blocked signal mask, and then never sees the signal).
    as_typed = [sys.executable, "-c", AS_FROM_A_TERMINAL, *command[1:]]
    process = subprocess.Popen(as_typed, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while done_shards(out) < 1:  # wait for the first shard; the run needs 6 shards of ~0.4 s each
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "no shard written"
            time.sleep(0.02)
        seen = f"{done_shards(out)} shards done at SIGINT, {time.monotonic() - deadline + 120:.2f} s after start"
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, f"{seen}\nstdout: {stdout[-2000:]}\nstderr: {stderr[-2000:]}"
    assert "run the same command to resume" in stderr
    assert "Traceback" not in stderr
    index = FeatureIndex.load(out)
    written = [s for s in index.shards if s.done]
    assert 1 <= len(written) < len(index.shards) == IMAGES // 8
    for shard in written:  # whatever was written is whole
        assert shard.file is not None
        assert digest((out / shard.file).read_bytes()) == shard.sha256

    resumed = subprocess.run([*command, "--json"], env=env, capture_output=True, text=True, timeout=300, check=False)
    assert resumed.returncode == 0, resumed.stderr
    report = json.loads(resumed.stdout)
    assert report["resumed"] == 8 * len(written)
    assert (report["extracted"], report["failed"], report["complete"]) == (IMAGES, [], True)

    whole = tmp_path / "whole"
    extract_features(
        sleepy.base_url, [str(images)], whole, "sleepy", ["conv"],
        reduce="mean", shard_size=8, batch_size=4, concurrency=1,
    )  # fmt: skip
    assert files_of(out) == files_of(whole)


def test_the_summary_names_every_failed_file(
    sleepy: LiveServer, images: Path, tmp_path: Path, hookserve: Hookserve
) -> None:
    source = tmp_path / "src"
    source.mkdir()
    for name in ("000.png", "001.png"):
        (source / name).write_bytes((images / name).read_bytes())
    (source / "broken.png").write_bytes(b"\x89PNG not really")
    result = hookserve("features", "sleepy", source, "-o", tmp_path / "out", *OPTIONS, "--url", sleepy.base_url)
    assert result.status == 0, result.err
    lines = result.out.splitlines()
    assert lines[0].startswith(f"2 of 3 files have features in {tmp_path / 'out'} (1 shards written now, 0 files")
    assert lines[1] == f"1 files could not be used (listed in {tmp_path / 'out' / 'report.json'}):"
    assert lines[2].startswith(f"  {(source / 'broken.png').as_posix()}: 400 image[0]")


def test_summary_lines_cut_long_failure_lists(tmp_path: Path) -> None:
    failed = {f"f{i:02d}.png": "400 not an image" for i in range(25)}
    report = ExtractionReport(tmp_path, 30, 5, 0, failed, 1, 30, 2.0, True)
    lines = summary_lines(report)
    assert "15.0 images/s" in lines[0]
    assert lines[2] == "  f00.png: 400 not an image"
    assert lines[-1] == "  ... and 5 more"
    assert len(lines) == 2 + 20 + 1


def test_the_progress_bar_shows_the_rate_and_resumed_files(capsys: pytest.CaptureFixture[str]) -> None:
    bar = Bar(True)
    bar.start(total=100, done=40)
    bar.advance(10)
    bar.close()
    err = capsys.readouterr().err
    assert "50/100" in err
    assert "img/s" in err
    assert "resumed after 40" in err
    assert bar.bar.smoothing == 0  # the average rate since the start, as the summary computes it
    quiet = Bar(False)
    quiet.start(total=10, done=0)
    quiet.advance(10)
    quiet.close()
    assert capsys.readouterr().err == ""


def test_features_reads_back_with_numpy(sleepy: LiveServer, images: Path, tmp_path: Path, hookserve: Hookserve) -> None:
    out = tmp_path / "out"
    assert hookserve("features", "sleepy", images, "-o", out, *OPTIONS, "--url", sleepy.base_url).status == 0
    index = json.loads((out / "index.json").read_text())
    assert index["request"] == {"model": "sleepy", "layers": ["conv"], "capture": "output", "reduce": "mean"}
    assert index["tensors"] == {"conv:output": {"shape": [4], "dtype": "float32"}}
    assert index["model"]["architecture"] == "sleepy.py:Sleepy"
    first = index["shards"][0]
    shard = load_file(str(out / first["file"]))
    assert shard["conv:output"].shape == (8, 4)
    assert np.isfinite(shard["conv:output"]).all()
    assert first["files"][0] == (images / "000.png").as_posix()


def run_features(*argv: object, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`hookserve features ...` as its own process, stderr a pipe (no terminal)."""
    return subprocess.run(
        [sys.executable, "-m", "service.cli", "features", *(str(a) for a in argv)],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_no_progress_frames_when_stderr_is_no_terminal_and_no_lock_file_left(
    sleepy: LiveServer, images: Path, tmp_path: Path
) -> None:
    options = [o for o in OPTIONS if o != "--no-progress"]
    done = run_features("sleepy", images, "-o", tmp_path / "out", *options, "--url", sleepy.base_url)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert not (tmp_path / "out" / ".lock").exists()


def test_a_typo_in_a_layer_leaves_the_folder_usable(sleepy: LiveServer, images: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    typo = run_features("sleepy", images, "-o", out, *OPTIONS, "--url", sleepy.base_url, "-l", "convv")
    assert typo.returncode == 3
    assert "unknown layer 'convv'" in typo.stderr
    fixed = run_features("sleepy", images, "-o", out, *OPTIONS, "--url", sleepy.base_url, "--json")
    assert fixed.returncode == 0, fixed.stderr
    assert json.loads(fixed.stdout)["extracted"] == IMAGES


def test_resume_does_not_depend_on_how_the_source_is_spelled(sleepy: LiveServer, images: Path, tmp_path: Path) -> None:
    (tmp_path / "digits").symlink_to(images, target_is_directory=True)
    first = run_features("sleepy", "digits", "-o", "out", *OPTIONS, "--url", sleepy.base_url, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    again = run_features(
        "sleepy", tmp_path / "digits", "-o", tmp_path / "out", *OPTIONS, "--url", sleepy.base_url, "--json",
        cwd=tmp_path,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert (report["files"], report["resumed"], report["images"]) == (IMAGES, IMAGES, 0)
    names, rows = read_features(tmp_path / "out")
    assert len(names) == len(rows) == IMAGES
    assert names[0] == "digits/000.png"


def test_ctrl_c_before_a_shard_is_complete_says_nothing_was_kept(
    sleepy: LiveServer, images: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    options = [o for o in OPTIONS if o not in ("--shard-size", "8")]  # the default: one shard of 48 files
    command = ["-m", "service.cli", "features", "sleepy", str(images), "-o", str(out), *options]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    as_typed = [sys.executable, "-c", AS_FROM_A_TERMINAL, *command, "--url", sleepy.base_url]
    process = subprocess.Popen(as_typed, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (out / "index.json").exists():  # planned; the one shard needs ~2.4 s of the model
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "no plan written"
            time.sleep(0.02)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, stderr
    assert done_shards(out) == 0
    assert stderr.strip() == (
        "interrupted before a shard was complete: nothing of this run was kept (a shard is written once its 1024 "
        "files are done; a smaller --shard-size keeps more of an interrupted run)"
    )
