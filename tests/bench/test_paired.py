"""Issue 12's ratios in alternating windows: ABBA order, medians, and the targets the report judges on them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from bench import paired
from bench.loadgen import LoadResult
from bench.payloads import Payload
from bench.report import introspection_targets, paired_table, render_markdown
from bench.workload import Kind, make_inputs
from tests.bench.test_introspection_report import synthetic


def _window(images_per_s: float, p50: float = 100.0, errors: int = 0) -> LoadResult:
    return LoadResult(
        name="x",
        concurrency=8,
        sent=100,
        ok=100,
        errors={"HTTP 503": errors} if errors else {},
        wall_s=8.0,
        rps=images_per_s,
        images_per_s=images_per_s,
        lat_ms={"p50": p50, "max": p50 * 2},
        loadgen_cores=0.05,
        loadgen_cpu_ms_per_req=0.2,
        machine_cores=1.9,
        server_cores=1.8,
        other_cores=0.01,
        response_bytes=300,
    )


def test_rounds_alternate_which_side_goes_first() -> None:
    assert [paired.order(i) for i in range(4)] == [
        ("top", "bottom"),
        ("bottom", "top"),
        ("top", "bottom"),
        ("bottom", "top"),
    ]


def test_the_ratio_is_the_median_of_the_rounds() -> None:
    pair = paired.ISSUE_12_PAIRS[1]  # every Conv2d over /predict, images/s
    rounds = [
        {"top": _window(40.0), "bottom": _window(60.0)},
        {"top": _window(30.0, errors=2), "bottom": _window(60.0)},
        {"top": _window(45.0), "bottom": _window(60.0)},
    ]
    record = paired.summarize(pair, rounds)
    assert [r["ratio"] for r in record["rounds"]] == pytest.approx([2 / 3, 0.5, 0.75])
    assert record["ratio"] == pytest.approx(2 / 3)  # the median, not the mean (0.639)
    assert [r["errors"] for r in record["rounds"]] == [0, 2, 0]
    assert [r["first"] for r in record["rounds"]] == ["top", "bottom", "top"]
    assert record["top"] == {"kind": Kind.ACTIVATIONS_ALLCONV_ST_JPEG, "clients": 8, "before": False}


def test_a_latency_ratio_divides_the_p50s() -> None:
    pair = next(p for p in paired.ISSUE_12_PAIRS if p.stat == "p50")
    record = paired.summarize(pair, [{"top": _window(30.0, p50=36.0), "bottom": _window(40.0, p50=30.0)}])
    assert record["ratio"] == pytest.approx(1.2)
    assert not record["higher_is_better"]


class _FakeServer:
    def __init__(self, url: str, pid: int) -> None:
        self.url = url
        self.pid = pid


def _measure_with(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, baseline_ref: str | None) -> list[Any]:
    """Run measure_pairs against fake servers; returns (records, the windows in the order they ran)."""
    servers = {False: _FakeServer("http://127.0.0.1:1", 11), True: _FakeServer("http://127.0.0.1:2", 22)}
    calls: list[tuple[str, str, int]] = []

    @contextmanager
    def fake_servers(workdir: Path, ref: str | None, log: paired.Log) -> Iterator[dict[bool, _FakeServer]]:
        yield servers if ref is not None else {False: servers[False]}

    def fake_measure(url: str, payload: Payload, clients: int, **kwargs: Any) -> LoadResult:
        calls.append((url, payload.name, clients))
        assert kwargs["server_pid"] == (22 if url.endswith(":2") else 11)
        assert kwargs["max_seconds"] == 2.0
        return _window(50.0 if url.endswith(":1") else 40.0)

    monkeypatch.setattr(paired, "_servers", fake_servers)
    monkeypatch.setattr(paired, "measure", fake_measure)
    monkeypatch.setattr(paired, "wait_idle", lambda *a, **k: 0.0)
    records = paired.measure_pairs(
        make_inputs(),
        lambda url: ["conv1"],
        tmp_path,
        lambda msg: None,
        rounds=2,
        window_s=2.0,
        idle_wait_s=0.0,
        baseline_ref=baseline_ref,
    )
    return [records, calls]


def test_measuring_runs_each_pair_abba_and_today_s_main_on_its_own_server(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    records, calls = _measure_with(monkeypatch, tmp_path, baseline_ref="c8b51c3")
    assert [r["name"] for r in records] == [p.name for p in paired.ISSUE_12_PAIRS]
    assert calls[:4] == [
        ("http://127.0.0.1:1", "activations-layer4-mean-jpeg", 8),
        ("http://127.0.0.1:1", "predict-jpeg-multipart", 8),
        ("http://127.0.0.1:1", "predict-jpeg-multipart", 8),  # round 2: bottom first
        ("http://127.0.0.1:1", "activations-layer4-mean-jpeg", 8),
    ]
    assert calls[-4:] == [
        ("http://127.0.0.1:1", "predict-jpeg-multipart", 32),
        ("http://127.0.0.1:2", "predict-jpeg-multipart", 32),
        ("http://127.0.0.1:2", "predict-jpeg-multipart", 32),
        ("http://127.0.0.1:1", "predict-jpeg-multipart", 32),
    ]
    assert records[-1]["ratio"] == pytest.approx(50.0 / 40.0)


def test_without_today_s_main_its_pair_is_left_out(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    records, calls = _measure_with(monkeypatch, tmp_path, baseline_ref=None)
    assert len(records) == len(paired.ISSUE_12_PAIRS) - 1
    assert all(url.endswith(":1") for url, _, _ in calls)


def _with_pairs(good_pairs: bool) -> dict[str, Any]:
    """The report's synthetic run (single windows that pass) plus paired medians that pass or fail."""
    results = synthetic(good=True)
    factor = 1.0 if good_pairs else 0.8  # the paired windows say the single ones were lucky
    records = []
    for pair in paired.ISSUE_12_PAIRS:
        top = 36.0 if pair.stat == "p50" else 44.0 * factor
        bottom = 30.0 if pair.stat == "p50" else 40.0
        if pair.stat == "p50" and not good_pairs:
            top = 42.0
        window_top, window_bottom = _window(top, p50=top), _window(bottom, p50=bottom)
        records.append(paired.summarize(pair, [{"top": window_top, "bottom": window_bottom}] * 3))
    results["pairs"] = records
    return results


def test_paired_medians_judge_the_ratio_targets_in_place_of_single_windows() -> None:
    targets = {t.name: (round(t.measured, 3), t.verdict) for t in introspection_targets(_with_pairs(False))}
    rounds = " [median of 3 ABBA rounds]"
    assert targets == {
        "mixed predict+activations, 8 clients: predict-jpeg-multipart share of completions": (0.5, "pass"),
        "mixed predict+activations, 8 clients: predict-jpeg-multipart max / own p50 latency": (3.158, "pass"),
        "mixed predict+activations, 8 clients: act share of completions": (0.5, "pass"),
        "mixed predict+activations, 8 clients: act max / own p50 latency": (3.5, "pass"),
        "/activations layer4 reduced, 8 clients / /predict, 8 clients (JPEG)" + rounds: (0.88, "FAIL"),
        "/activations every Conv2d safetensors, 8 clients / /predict (JPEG)" + rounds: (0.88, "pass"),
        "/saliency gradcam, 8 clients / /predict, 8 clients (JPEG)" + rounds: (0.88, "pass"),
        "/saliency gradcam p50 / /predict p50, 1 client (tensor input)" + rounds: (1.4, "FAIL"),
        "/predict JPEG, 32 clients / today's main in the same run" + rounds: (0.88, "FAIL"),
    }


def test_the_paired_section_shows_each_round_and_the_single_window_ratio() -> None:
    results = _with_pairs(True)
    table = paired_table(results)
    assert (
        "| /activations every Conv2d safetensors, 8 clients / /predict (JPEG) | 44.0 / 40.0, 44.0 / 40.0, "
        "44.0 / 40.0 (images/s) | 1.100, 1.100, 1.100 | 1.100 | 0.750 | >= 0.70 | pass |"
    ) in table
    assert (
        "| 36.0 / 30.0, 36.0 / 30.0, 36.0 / 30.0 (p50 ms) | 1.200, 1.200, 1.200 | 1.200 | 1.200 | <= 1.30 | pass |"
        in table
    )
    assert "today's main in the same run | 44.0 / 40.0" in table
    assert "| 1.100 | 1.128 | >= 1.10 | pass |" in table
    md = render_markdown(results)
    assert "## Introspection-under-load targets: 9 of 9 pass" in md
    assert "## Introspection ratios in alternating windows" in md
