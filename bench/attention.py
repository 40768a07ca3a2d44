"""/attention of one block beside /predict on the ImageNet-shape ViT (vit_tiny), in alternating windows.

One `default` server over the built-in registry; the cat JPEG uploaded to vit_tiny's `/predict` and to its
`/attention` of `blocks.11` (the class token's row of every head, JSON), each at 8 clients, in ABBA rounds
(`bench.paired`): the ratio carries none of the machine's drift. The record also keeps what vit_tiny's INFO says
of its prediction path and whether predictions run its attention on the fused kernel: /attention unfuses the
block on a hook lane for its own batch only, so predictions must keep it.

    .venv/bin/python -m bench.attention --into bench/RESULTS.json   # then: python -m bench.report
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from bench.attention_report import BLOCK, CLIENTS, MODEL, TARGET
from bench.configs import DEFAULT
from bench.loadgen import LoadResult, measure
from bench.paired import Log, Pair, Side, measure_pair
from bench.payloads import Payload, multipart_payload
from bench.server import Server, free_port
from bench.workload import JPEG, Inputs, Kind, make_inputs

PAIR = Pair(
    f"{MODEL} /attention of {BLOCK} / /predict, JPEG, {CLIENTS} clients",
    Side(Kind.VIT_ATTENTION_JPEG, CLIENTS),
    Side(Kind.VIT_PREDICT_JPEG, CLIENTS),
    "images_per_s",
    TARGET,
    True,
)


def payloads(inputs: Inputs) -> dict[Kind, Payload]:
    files = [("chelsea.jpg", inputs.jpeg, JPEG)]
    return {
        Kind.VIT_PREDICT_JPEG: multipart_payload(Kind.VIT_PREDICT_JPEG.value, "/predict", {"model": MODEL}, files),
        Kind.VIT_ATTENTION_JPEG: multipart_payload(
            Kind.VIT_ATTENTION_JPEG.value, "/attention", {"model": MODEL, "blocks": BLOCK, "format": "json"}, files
        ),
    }


def measure_attention(
    inputs: Inputs, workdir: Path, log: Log, *, rounds: int = 4, window_s: float = 8.0, idle_wait_s: float = 120.0
) -> dict[str, Any]:
    """The paired record, with vit_tiny's prediction path and attention kernel as its INFO reports them."""
    with Server(replace(DEFAULT.config, name="attention"), free_port(), workdir) as server:
        info = httpx.get(f"{server.url}/models/{MODEL}", timeout=30).json()
        attention = info.get("attention") or {}
        path = {"prediction_path": info.get("prediction_path"), "fused": attention.get("fused")}
        log(f"{MODEL}: predictions on {path['prediction_path']}, attention fused: {path['fused']}")
        built = payloads(inputs)

        def window(which: str, side: Side) -> LoadResult:
            return measure(server.url, built[side.kind], side.clients, max_seconds=window_s, server_pid=server.pid)

        record = measure_pair(PAIR, window, rounds, idle_wait_s, log)
        after = httpx.get(f"{server.url}/models/{MODEL}", timeout=30).json()
        path["fused_after"] = (after.get("attention") or {}).get("fused")
        path["hooks_after"] = after.get("hooks")
    shown = ", ".join(f"{r['ratio']:.3f}" for r in record["rounds"])
    log(f"  {PAIR.name}: {shown}; median {record['ratio']:.3f}")
    return record | path


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--window", type=float, default=8.0, help="seconds of each window")
    ap.add_argument("--idle-wait", type=float, default=120.0, help="at most this long for an idle machine")
    ap.add_argument("--into", type=Path, default=None, help="add the record to this RESULTS.json")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hookserve-attention-") as tmp:
        log: Log = lambda line: print(line, flush=True)  # noqa: E731
        record = measure_attention(
            make_inputs(), Path(tmp), log, rounds=args.rounds, window_s=args.window, idle_wait_s=args.idle_wait
        )
    if args.into is not None:
        results = json.loads(args.into.read_text())
        results["attention"] = record
        args.into.write_text(json.dumps(results, indent=2) + "\n")
    else:
        json.dump(record, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
