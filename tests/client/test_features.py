"""Bulk feature extraction against a live server: right numbers, resumable, nothing dropped silently."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from service.client import Client, NotFound, Wire
from service.client.features import (
    ExtractionMismatch,
    ExtractionReport,
    FeatureIndex,
    Progress,
    Shard,
    extract_features,
    list_images,
    read_features,
)
from service.client.features.store import DirectoryBusy, DirectoryLock, digest, write_atomic
from tests.client.servers import HELD_OUT, held_out_digits
from tests.reliability.live_server import LiveServer

TOLERANCE = 1e-5  # float32 results of the same input in batches of other sizes


class Interrupt(Exception):
    """Stands for Ctrl-C at an arbitrary point of a run."""


class StopAfter(Progress):
    """Interrupts the run once `shards` shards are on disk; counts what it saw."""

    def __init__(self, shards: int) -> None:
        self.shards = shards
        self.written: list[str] = []
        self.started: tuple[int, int] | None = None
        self.advanced = 0

    def start(self, total: int, done: int) -> None:
        self.started = (total, done)

    def advance(self, images: int) -> None:
        self.advanced += images

    def shard_written(self, shard: Shard) -> None:
        self.written.append(str(shard.file))
        if len(self.written) >= self.shards:
            raise Interrupt


def files_of(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[Path, int]]:
    return held_out_digits(tmp_path_factory.mktemp("digits") / "heldout")


Features = dict[str, dict[str, np.ndarray]]


@pytest.fixture(scope="module")
def per_image(live: LiveServer, digits: list[tuple[Path, int]]) -> Features:
    """conv2 output and fc1 input of each held-out digit, one /activations request (JSON) per image."""
    out = {}
    with Client(live.base_url, wire=Wire.json) as client:
        for path, _ in digits:
            acts = client.activations("lenet", path, ["conv2", "fc1"], capture="both")
            out[path.name] = {"conv2:output": acts.output("conv2")[0], "fc1:input": acts.input("fc1")[0]}
    return out


def test_features_of_the_held_out_digits_equal_per_image_activations(
    live: LiveServer, digits: list[tuple[Path, int]], per_image: Features, tmp_path: Path
) -> None:
    source = digits[0][0].parent
    report = extract_features(
        live.base_url, [source], tmp_path / "out", "lenet", ["conv2", "fc1"], capture="both", shard_size=100
    )
    assert (report.files, report.extracted, report.failed, report.complete) == (HELD_OUT, HELD_OUT, {}, True)
    assert report.shards_written == 4
    index = FeatureIndex.load(tmp_path / "out")
    assert index.tensors["conv2:output"] == {"shape": [16, 10, 10], "dtype": "float32"}
    assert index.tensors["fc1:input"] == {"shape": [400], "dtype": "float32"}
    assert index.model["name"] == "lenet"
    assert index.model["weights"] == "lenet_digits.pt"
    assert index.request == {"model": "lenet", "layers": ["conv2", "fc1"], "capture": "both", "reduce": None}
    for key in ("conv2:output", "fc1:input"):
        names, features = read_features(tmp_path / "out", key)
        assert names == [str(p.as_posix()) for p, _ in digits]  # rows in file order
        for name, row in zip(names, features, strict=True):
            # batches of 8 (which the server may merge further) against batches of 1: float32 sums in
            # another order, so equal to a few ulps, not bit for bit
            np.testing.assert_allclose(row, per_image[Path(name).name][key], rtol=TOLERANCE, atol=TOLERANCE)
    shard, row = index.locate(digits[123][0].as_posix()) or (-1, -1)
    assert (shard, row) == (1, 23)


def test_an_interrupted_run_resumes_to_the_same_files(
    live: LiveServer, digits: list[tuple[Path, int]], tmp_path: Path
) -> None:
    glob = str(digits[0][0].parent / "00[0-8]*.png")  # 0000..0089: a glob source, and six files
    sources: list[str | Path] = [glob, *(p for p, _ in digits[90:96])]

    def run(out: Path, progress: Progress | None = None) -> ExtractionReport:
        # one request at a time: identical requests, so bit-identical numbers (see the next test)
        return extract_features(
            live.base_url, sources, out, "lenet", ["conv2", "fc3"],
            reduce="max", shard_size=16, batch_size=4, concurrency=1, progress=progress,
        )  # fmt: skip

    whole = tmp_path / "whole"
    run(whole)
    parts = tmp_path / "parts"
    stopper = StopAfter(shards=3)
    with pytest.raises(Interrupt):
        run(parts, stopper)
    # What was written before the interruption is complete and recorded.
    index = FeatureIndex.load(parts)
    done = [s for s in index.shards if s.done]
    assert [s.file for s in done] == stopper.written
    assert not index.complete
    for shard in done:
        assert shard.file is not None
        assert digest((parts / shard.file).read_bytes()) == shard.sha256
    assert not [p for p in parts.iterdir() if ".tmp-" in p.name]
    assert json.loads((parts / "report.json").read_text())["complete"] is False
    # The rerun computes only the rest, and ends with the very same files.
    again = StopAfter(shards=10**6)
    report = run(parts, again)
    assert again.started == (96, 48)
    assert again.advanced == 48
    assert again.written == [f"features-{n:05d}.safetensors" for n in range(3, 6)]
    assert report.resumed == 48
    assert files_of(parts) == files_of(whole)


def test_concurrent_interrupted_runs_resume_to_the_same_rows(
    live: LiveServer, digits: list[tuple[Path, int]], tmp_path: Path
) -> None:
    """With requests in flight the shards finish out of order; the resumed result still matches.

    Values are compared to TOLERANCE rather than bit for bit: the server batches concurrent
    requests together, and a batch of another size may sum in another order.
    """
    source = digits[0][0].parent

    def run(out: Path, progress: Progress | None = None) -> ExtractionReport:
        return extract_features(
            live.base_url, [source], out, "lenet", ["fc2"],
            shard_size=20, batch_size=4, concurrency=4, progress=progress,
        )  # fmt: skip

    run(tmp_path / "whole")
    with pytest.raises(Interrupt):
        run(tmp_path / "parts", StopAfter(5))
    report = run(tmp_path / "parts")
    assert report.complete
    assert report.resumed >= 5 * 20
    whole, parts = FeatureIndex.load(tmp_path / "whole"), FeatureIndex.load(tmp_path / "parts")
    assert [s.files for s in parts.shards] == [s.files for s in whole.shards]
    names_a, a = read_features(tmp_path / "whole")
    names_b, b = read_features(tmp_path / "parts")
    assert names_a == names_b
    np.testing.assert_allclose(a, b, rtol=TOLERANCE, atol=TOLERANCE)


def test_unreadable_files_are_reported_and_the_rest_extracted(
    live: LiveServer, digits: list[tuple[Path, int]], per_image: Features, tmp_path: Path
) -> None:
    source = tmp_path / "mixed"
    source.mkdir()
    for path, _ in digits[:20]:
        (source / path.name).write_bytes(path.read_bytes())
    png = digits[0][0].read_bytes()
    (source / "0005b-notes.txt").write_text("not an image")
    (source / "0007b-empty.png").write_bytes(b"")
    (source / "0009b-truncated.png").write_bytes(png[: len(png) // 2])
    Image.new("1", (8000, 6000)).save(source / "0011b-huge.png")  # 48 megapixels: over the server's limit
    (source / "0013b-gone.png").symlink_to(tmp_path / "nowhere.png")
    (source / ".hidden.png").write_bytes(png)  # hidden files are no input
    out = source / "features"  # inside the source: left out of it
    report = extract_features(live.base_url, [source], out, "lenet", ["fc1"], capture="input", batch_size=8)
    failed = json.loads((out / "report.json").read_text())
    reasons = {Path(f["file"]).name: f["reason"] for f in failed["failed"]}
    assert set(reasons) == {
        "0005b-notes.txt",
        "0007b-empty.png",
        "0009b-truncated.png",
        "0011b-huge.png",
        "0013b-gone.png",
    }
    assert reasons["0005b-notes.txt"].startswith("400 ")
    assert reasons["0009b-truncated.png"].startswith("400 ")
    assert reasons["0011b-huge.png"].startswith("413 ")
    assert reasons["0007b-empty.png"] == "empty file"
    assert reasons["0013b-gone.png"].startswith("cannot read")
    assert (failed["files"], failed["extracted"], failed["complete"]) == (25, 20, True)
    assert {Path(k).name for k in report.failed} == set(reasons)
    names, features = read_features(out)
    assert [Path(n).name for n in names] == [p.name for p, _ in digits[:20]]
    for name, row in zip(names, features, strict=True):  # good images that shared a batch with bad ones
        np.testing.assert_allclose(row, per_image[Path(name).name]["fc1:input"], rtol=TOLERANCE, atol=TOLERANCE)


def test_a_lost_shard_is_recomputed_alone(live: LiveServer, digits: list[tuple[Path, int]], tmp_path: Path) -> None:
    sources = [p for p, _ in digits[:40]]
    out = tmp_path / "out"
    extract_features(live.base_url, sources, out, "lenet", ["fc3"], shard_size=10, concurrency=1)
    before = files_of(out)
    (out / "features-00002.safetensors").unlink()
    report = extract_features(live.base_url, sources, out, "lenet", ["fc3"], shard_size=10, concurrency=1)
    assert (report.shards_written, report.resumed, report.images) == (1, 30, 10)
    assert files_of(out) == before


def test_a_truncated_shard_is_recomputed(live: LiveServer, digits: list[tuple[Path, int]], tmp_path: Path) -> None:
    """A shard cut short (a disk that filled, a copy that stopped) is there but not whole: it is done again."""
    sources = [p for p, _ in digits[:30]]
    out = tmp_path / "out"
    extract_features(live.base_url, sources, out, "lenet", ["fc3"], shard_size=10, concurrency=1)
    before = files_of(out)
    shard = out / "features-00001.safetensors"
    shard.write_bytes(before[shard.name][:-40])
    report = extract_features(live.base_url, sources, out, "lenet", ["fc3"], shard_size=10, concurrency=1)
    assert (report.shards_written, report.resumed, report.images) == (1, 20, 10)
    assert files_of(out) == before


def test_a_lost_shard_is_planned_again_with_the_files_that_failed_in_it(
    live: LiveServer, digits: list[tuple[Path, int]], tmp_path: Path
) -> None:
    """Recomputing a lost shard tries its failed files again too: they stay in the plan and in the report."""
    source = tmp_path / "mixed"
    source.mkdir()
    for path, _ in digits[:12]:
        os.link(path, source / path.name)
    (source / "0003b-notes.txt").write_text("not an image")  # sorts into the first shard
    out = tmp_path / "out"
    first = extract_features(live.base_url, [source], out, "lenet", ["fc3"], shard_size=8, concurrency=1)
    bad = (source / "0003b-notes.txt").as_posix()
    assert (first.files, first.extracted, list(first.failed)) == (13, 12, [bad])
    before = files_of(out)
    (out / "features-00000.safetensors").unlink()
    report = extract_features(live.base_url, [source], out, "lenet", ["fc3"], shard_size=8, concurrency=1)
    assert (report.files, report.extracted, list(report.failed)) == (13, 12, [bad])
    assert (report.shards_written, report.images) == (1, 8)  # the shard's 7 images and the failed file
    assert bad in FeatureIndex.load(out).shards[0].failed
    assert files_of(out) == before


def test_a_run_stopped_while_writing_a_shard_leaves_an_index_of_whole_shards_only(
    live: LiveServer, digits: list[tuple[Path, int]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The index that records a shard is written after the shard: stopped between the two, the index on disk names
    only shards that are there, and the rerun ends with the files of an uninterrupted run."""
    sources = [p for p, _ in digits[:30]]
    whole, out = tmp_path / "whole", tmp_path / "out"
    extract_features(live.base_url, sources, whole, "lenet", ["fc3"], shard_size=10, concurrency=1)

    def stopped_at_the_second_shard(path: Path, data: bytes) -> None:
        if path.name == "features-00001.safetensors":
            raise Interrupt
        write_atomic(path, data)

    monkeypatch.setattr("service.client.features.extract.write_atomic", stopped_at_the_second_shard)
    with pytest.raises(Interrupt):
        extract_features(live.base_url, sources, out, "lenet", ["fc3"], shard_size=10, concurrency=1)
    index = FeatureIndex.load(out)
    assert [s.file for s in index.shards if s.done] == ["features-00000.safetensors"]
    names, _ = read_features(out)  # every shard the index records is there
    assert names == [p.as_posix() for p in sources[:10]]
    monkeypatch.undo()
    report = extract_features(live.base_url, sources, out, "lenet", ["fc3"], shard_size=10, concurrency=1)
    assert (report.resumed, report.shards_written) == (10, 2)
    assert files_of(out) == files_of(whole)


def test_another_request_in_the_same_directory_is_refused(
    live: LiveServer, digits: list[tuple[Path, int]], tmp_path: Path
) -> None:
    sources = [digits[0][0]]
    extract_features(live.base_url, sources, tmp_path, "lenet", ["fc3"])
    with pytest.raises(ExtractionMismatch, match="same model, layers"):
        extract_features(live.base_url, sources, tmp_path, "lenet", ["fc2"])
    with pytest.raises(ExtractionMismatch):
        extract_features(live.base_url, sources, tmp_path, "lenet", ["fc3"], shard_size=7)


def test_new_files_on_resume_get_new_shards(live: LiveServer, digits: list[tuple[Path, int]], tmp_path: Path) -> None:
    source = tmp_path / "growing"
    source.mkdir()
    for path, _ in digits[:12]:
        os.link(path, source / path.name)
    out = tmp_path / "out"
    extract_features(live.base_url, [source], out, "lenet", ["fc3"], shard_size=8)
    for path, _ in digits[12:15]:
        os.link(path, source / path.name)
    report = extract_features(live.base_url, [source], out, "lenet", ["fc3"], shard_size=8)
    assert (report.resumed, report.images, report.extracted) == (12, 3, 15)
    index = FeatureIndex.load(out)
    assert [len(s.files) for s in index.shards] == [8, 4, 3]


def test_two_runs_cannot_write_one_directory(live: LiveServer, digits: list[tuple[Path, int]], tmp_path: Path) -> None:
    with DirectoryLock(tmp_path), pytest.raises(DirectoryBusy, match="another run is writing"):
        extract_features(live.base_url, [digits[0][0]], tmp_path, "lenet", ["fc3"])
    report = extract_features(live.base_url, [digits[0][0]], tmp_path, "lenet", ["fc3"])  # free again
    assert report.complete


def test_an_unknown_model_writes_nothing(live: LiveServer, digits: list[tuple[Path, int]], tmp_path: Path) -> None:
    with pytest.raises(NotFound):
        extract_features(live.base_url, [digits[0][0]], tmp_path / "out", "nope", ["fc3"])
    assert not (tmp_path / "out").exists()


def test_sources_are_directories_files_and_globs(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    for name in ("a/1.png", "a/b/2.png", "a/.x.png", "3.jpg"):
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "a" / ".git").mkdir()
    (tmp_path / "a" / ".git" / "4.png").write_bytes(b"x")
    found = list_images([tmp_path / "a", str(tmp_path / "*.jpg"), tmp_path / "a" / "1.png"])
    keys = [key for key, _ in found]
    assert keys == sorted(
        [(tmp_path / "3.jpg").as_posix(), (tmp_path / "a/1.png").as_posix(), (tmp_path / "a/b/2.png").as_posix()]
    )
    with pytest.raises(FileNotFoundError, match="no files"):
        list_images([str(tmp_path / "*.webp")])
