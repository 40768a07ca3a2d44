"""The bulk-features section of RESULTS.md (torch-free, so that `python -m bench.report` can render it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

TARGET = 0.8  # `hookserve features` images/s >= 0.8 x raw in-process extraction (torch, NCHW) at batch 8
TARGET_ORT = 0.9  # and >= 0.9 x raw in-process extraction on ONNX Runtime at batch 8 (captures on the fast path)


def section(results: Mapping[str, Any]) -> list[str]:
    """The lines of the RESULTS.md section (none when the run measured no features point)."""
    point = results.get("features")
    if not point:
        return []
    raw, hs = point["raw"], point["hookserve"]
    ort = raw.get("raw-ort")  # runs before the ONNX Runtime row have none
    met = point["ratio"] >= point["target"] and (ort is None or point["ratio_ort"] >= point["target_ort"])
    verdict = "pass" if met else "FAIL"
    rows = [
        f"| {raw['raw']['name']} | {raw['raw']['images_per_s']:.1f} | 1.00 |",
        f"| {raw['raw-cl']['name']} | {raw['raw-cl']['images_per_s']:.1f} | "
        f"{raw['raw-cl']['images_per_s'] / raw['raw']['images_per_s']:.2f} |",
        *(
            [f"| {ort['name']} | {ort['images_per_s']:.1f} | {ort['images_per_s'] / raw['raw']['images_per_s']:.2f} |"]
            if ort is not None
            else []
        ),
        f"| `hookserve features` -c {point['concurrency']} -b {point['batch']} ({point['config']} config), "
        f"server using {hs['server_cores']:.2f} cores | {hs['images_per_s']:.1f} | {point['ratio']:.2f} |",
        f"| the same, counting the command's start-up | {hs['wall_images_per_s']:.1f} | "
        f"{hs['wall_images_per_s'] / raw['raw']['images_per_s']:.2f} |",
    ]
    return [
        "",
        f"## Bulk features: {verdict}",
        "",
        f"{point['images']} copies of the cat JPEG, {point['model']} `{point['layer']}` reduced by "
        f"{point['reduce']} into safetensors shards. Target: `hookserve features` >= {point['target']} x raw "
        f"(NCHW); measured {point['ratio']:.2f} x ({point['ratio_cl']:.2f} x raw channels_last)."
        + (
            f" Target: >= {point['target_ort']} x raw on ONNX Runtime; measured {point['ratio_ort']:.2f} x."
            if ort is not None
            else ""
        ),
        "",
        "| | images/s | x raw |",
        "|---|---:|---:|",
        *rows,
    ]
