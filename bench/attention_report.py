"""The attention section of RESULTS.md (torch-free, so that `python -m bench.report` can render it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MODEL = "vit_tiny"  # the ImageNet-shape ViT of the built-in registry
BLOCK = "blocks.11"
CLIENTS = 8
TARGET = 0.8  # /attention of one block >= 0.8 x /predict's throughput at 8 clients


def section(results: Mapping[str, Any]) -> list[str]:
    """The lines of the section (none when the run measured no attention point)."""
    record = results.get("attention")
    if not record:
        return []
    ratio = float(record["ratio"])
    verdict = "pass" if ratio >= TARGET else "FAIL"
    rows = [
        f"| {i + 1} | {r['first']} | {r['top']:.1f} | {r['bottom']:.1f} | {r['ratio']:.3f} | {r['errors']} |"
        for i, r in enumerate(record["rounds"])
    ]
    return [
        "",
        f"## Attention maps on a ViT: {verdict}",
        "",
        f"{MODEL} (timm `vit_tiny_patch16_224`, random weights) with the cat JPEG uploaded: `/attention` of "
        f"`{BLOCK}` (the class token's row, every head, JSON) against `/predict`, {CLIENTS} clients each, in "
        f"alternating windows (ABBA). Target: >= {TARGET} x; median {ratio:.3f} x. Predictions run on "
        f"`{record.get('prediction_path')}` with attention fused: {record.get('fused')} (after the run: "
        f"{record.get('fused_after')}, hooks {record.get('hooks_after')}); `/attention` unfuses its block on a "
        "hook lane for its own batch only.",
        "",
        "| round | first | /attention images/s | /predict images/s | ratio | errors |",
        "|---:|---|---:|---:|---:|---:|",
        *rows,
    ]
