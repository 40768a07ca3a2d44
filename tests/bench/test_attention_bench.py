"""The attention benchmark point: its two requests against the real app, and its report section."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from fastapi.testclient import TestClient

from bench.attention import PAIR, payloads
from bench.attention_report import TARGET, section
from bench.report import main as report_main
from bench.report import render_markdown
from bench.workload import Kind, make_inputs


def test_both_requests_upload_the_cat_to_vit_tiny(builtin_client: TestClient) -> None:
    built = payloads(make_inputs())
    assert (PAIR.top.kind, PAIR.bottom.kind) == (Kind.VIT_ATTENTION_JPEG, Kind.VIT_PREDICT_JPEG)
    answers = {}
    for kind, payload in built.items():
        response = builtin_client.post(payload.path, content=payload.content, headers=payload.headers)
        assert response.status_code == 200, response.text[:300]
        answers[kind] = orjson.loads(response.content)
    maps = answers[Kind.VIT_ATTENTION_JPEG]
    assert maps["model"] == "vit_tiny"
    assert maps["attention"]["blocks.11.attn"]["shape"] == [1, 3, 1, 197]
    top1 = answers[Kind.VIT_PREDICT_JPEG]["predictions"][0]["top_k"][0]["index"]
    assert maps["predictions"][0]["top_k"][0]["index"] == top1  # the same forward, on the hook lane


def record(ratio: float) -> dict[str, Any]:
    rounds = [{"top": 8.0 * ratio, "bottom": 8.0, "ratio": ratio, "errors": 0, "first": "top"}]
    return {"ratio": ratio, "rounds": rounds, "prediction_path": "eager", "fused": True, "fused_after": True}


@pytest.mark.parametrize(("ratio", "verdict"), [(0.95, "pass"), (TARGET - 0.1, "FAIL")])
def test_the_section_judges_the_median_and_shows_the_path(ratio: float, verdict: str, tmp_path: Path) -> None:
    lines = section({"attention": record(ratio)})
    assert lines[1] == f"## Attention maps on a ViT: {verdict}"
    assert "Predictions run on `eager` with attention fused: True" in lines[3]
    assert section({}) == []
    data = tmp_path / "RESULTS.json"
    results = {"configs": {}, "raw": {}, "points": [], "attention": record(ratio)}
    data.write_text(json.dumps(results))
    report_main([str(data)])
    assert f"## Attention maps on a ViT: {verdict}" in (tmp_path / "RESULTS.md").read_text()
    assert render_markdown(results).count("Attention maps on a ViT") == 1
