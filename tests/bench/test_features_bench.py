"""The bulk-features benchmark point: its raw counterpart runs, and its report section renders and is kept."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.features import LAYER, copy_images, raw_features, raw_onnxruntime_features
from bench.features_report import TARGET, TARGET_ORT, section
from bench.report import main as report_main
from bench.report import render_markdown
from bench.workload import make_jpeg


def fake_point(ratio: float, ratio_ort: float | None = None) -> dict[str, Any]:
    raw = {"name": "raw x", "images_per_s": 50.0}
    ort: dict[str, Any] = {}
    if ratio_ort is not None:
        ort = {"ratio_ort": ratio_ort, "target_ort": TARGET_ORT}
    point = {
        "images": 256,
        "model": "resnet18",
        "layer": LAYER,
        "reduce": "mean",
        "config": "default",
        "concurrency": 4,
        "batch": 8,
        "raw": {"raw": raw, "raw-cl": {"name": "raw x cl", "images_per_s": 60.0}},
        "hookserve": {"images_per_s": 50.0 * ratio, "wall_images_per_s": 40.0, "server_cores": 1.7},
        "ratio": ratio,
        "ratio_cl": 50.0 * ratio / 60.0,
        "target": TARGET,
        **ort,
    }
    if ratio_ort is not None:
        point["raw"]["raw-ort"] = {"name": "raw x ort", "images_per_s": 50.0 * ratio / ratio_ort}
    return point


@pytest.mark.parametrize(("ratio", "verdict"), [(0.9, "pass"), (0.7, "FAIL")])
def test_the_section_says_whether_the_target_is_met(ratio: float, verdict: str) -> None:
    lines = section({"features": fake_point(ratio)})
    assert lines[1] == f"## Bulk features: {verdict}"
    assert f"measured {ratio:.2f} x" in lines[3]
    assert section({}) == []


@pytest.mark.parametrize(("ratio_ort", "verdict"), [(0.95, "pass"), (0.85, "FAIL")])
def test_the_onnxruntime_target_decides_too_when_measured(ratio_ort: float, verdict: str) -> None:
    lines = section({"features": fake_point(0.9, ratio_ort)})
    assert lines[1] == f"## Bulk features: {verdict}"
    assert f"Target: >= {TARGET_ORT} x raw on ONNX Runtime; measured {ratio_ort:.2f} x." in lines[3]
    assert any(line.startswith("| raw x ort |") for line in lines)


def test_a_rerendered_report_keeps_the_section(tmp_path: Path) -> None:
    results = {"configs": {}, "raw": {}, "points": [], "features": fake_point(0.9)}
    assert "## Bulk features: pass" in render_markdown(results)
    data = tmp_path / "RESULTS.json"
    data.write_text(json.dumps(results))
    report_main([str(data)])
    assert "## Bulk features: pass" in (tmp_path / "RESULTS.md").read_text()


def test_the_raw_counterpart_extracts_every_image(tmp_path: Path) -> None:
    paths = copy_images(tmp_path, make_jpeg(), 10)
    assert len(list(tmp_path.glob("cat_*.jpg"))) == 10
    row = raw_features(paths, threads=1)
    assert row["images"] == 10
    assert row["images_per_s"] > 0
    assert "batch 8" in row["name"]


def test_the_onnxruntime_counterpart_extracts_every_image(tmp_path: Path) -> None:
    paths = copy_images(tmp_path, make_jpeg(), 10)
    row = raw_onnxruntime_features(paths, threads=1)
    assert row["images"] == 10
    assert "ONNX Runtime" in row["name"]
    assert "batch 8" in row["name"]
