"""The cluster row's arithmetic and the page it writes, from made-up results (no servers started)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil

from bench import cluster
from bench.workload import Kind

DOC = Path(__file__).resolve().parents[2] / "docs" / "cluster.md"


def point(server: str, kind: Kind, clients: int, *, images_per_s: float, p50: float, cpu_s: float) -> dict[str, Any]:
    wall = 10.0
    ok = int(images_per_s * wall)
    result = {
        "images_per_s": images_per_s,
        "lat_ms": {"p50": p50},
        "wall_s": wall,
        "ok": ok,
        "other_cores": 0.25,
        "extra": {"tree_cpu_s": cpu_s, "images_per_cpu_s": ok / cpu_s},
    }
    return {"server": server, "kind": kind.value, "concurrency": clients, "result": result}


def results() -> dict[str, Any]:
    jpeg, lenet = Kind.PREDICT_JPEG_MULTIPART, Kind.LENET_PREDICT
    return {
        "points": [
            point("one-process", jpeg, 32, images_per_s=40.0, p50=700.0, cpu_s=20.0),  # 400 images / 20 CPU-s
            point("one-process", jpeg, 1, images_per_s=20.0, p50=50.0, cpu_s=8.0),
            point("one-process", lenet, 1, images_per_s=300.0, p50=3.0, cpu_s=9.0),
            point("ray", jpeg, 32, images_per_s=36.0, p50=800.0, cpu_s=20.0),  # 360 / 20: 18 per CPU-s, 0.90 x
            point("ray", jpeg, 1, images_per_s=18.0, p50=55.0, cpu_s=8.0),
            point("ray", lenet, 1, images_per_s=200.0, p50=5.5, cpu_s=9.0),
        ],
        "footprint": {"one-process": {"ready_s": 9.0, "pss_mb": 500.0}, "ray": {"ready_s": 30.0, "pss_mb": 2000.0}},
        "breakdown": {"handle_ms": 4.0, "empty_handle_ms": 1.0, "app_ms": 2.5},
        "machine": {"cores": 2, "cpu": "Test CPU", "mem_gib": 24},
        "when": "2026-01-01 00:00",
    }


def test_the_row_gives_images_per_cpu_second_and_the_added_p50() -> None:
    table = cluster.table(results())
    assert "| 20.0 | 2.00 |" in table  # one process: 20 images per CPU-second on 2 cores
    assert "**0.90 x**" in table
    assert "**+2.5 ms**" in table  # lenet at 1 client: 5.5 against 3.0


def test_the_breakdown_splits_what_the_cluster_adds() -> None:
    rows = cluster.breakdown_table(results())
    assert "(front - handle) | +1.5 |" in rows
    assert "(empty call) | +1.0 |" in rows
    assert "(handle - empty - app) | +0.5 |" in rows
    assert "(one process - app) | +0.5 |" in rows


def test_write_docs_replaces_only_the_measured_block(tmp_path: Path) -> None:
    page = tmp_path / "cluster.md"
    page.write_text(f"before\n{cluster.DOCS_START}\nold numbers\n{cluster.DOCS_END}\nafter\n")
    cluster.write_docs(page, results(), "python -m bench.cluster --write-docs docs/cluster.md")
    text = page.read_text()
    assert text.startswith("before\n")
    assert text.endswith("after\n")
    assert "old numbers" not in text
    assert "`python -m bench.cluster --write-docs docs/cluster.md` on 2026-01-01 00:00: 2 cores (Test CPU)" in text
    assert "**0.90 x**" in text
    assert DOC.read_text().count(cluster.DOCS_START) == 1  # the real page has the block the command fills


def test_tree_cpu_counts_what_children_used_after_they_ended() -> None:
    """A parent that ran a busy child (0.3 s of CPU) and waited for it: its tree's CPU holds the child's."""
    busy = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\n"
    run_child = f"subprocess.run([sys.executable, '-c', {busy!r}])"
    code = f"import subprocess, sys, time; {run_child}; print(1, flush=True); time.sleep(30)"
    with subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE) as parent:
        try:
            assert parent.stdout is not None
            parent.stdout.readline()  # the child has ended and been waited for
            own = psutil.Process(parent.pid).cpu_times()
            assert own.user + own.system < 0.3
            assert cluster.tree_cpu_seconds(parent.pid) >= 0.3
        finally:
            parent.kill()


def test_a_report_rendered_again_keeps_the_cluster_row_before_the_notes(tmp_path: Path) -> None:
    import json

    from bench import report

    run = {"cluster": {**results(), "description": {"ray": "Ray Serve, 2 replicas, proxy in front"}}}
    (tmp_path / "RESULTS.json").write_text(json.dumps(run))
    (tmp_path / "notes.md").write_text("Written after the run.")
    report.main([str(tmp_path / "RESULTS.json"), "--notes", str(tmp_path / "notes.md")])
    text = (tmp_path / "RESULTS.md").read_text()
    assert text.index("## Cluster: Ray Serve replicas against one process") < text.index("## Notes")
    assert "| Ray Serve, 2 replicas, proxy in front | 36.0 |" in text  # the label of the run, not today's
