"""/activations of layer4 reduced beside /predict, with capture plans (ONNX Runtime) and with hooks only.

Two `default` servers over the built-in registry, one after the other: the Settings defaults (capture plans on)
and `HOOKSERVE_CAPTURE_PLANS=0` (every capture by hooks). On each, resnet18's `/activations` of `layer4` with
`reduce=mean` (JSON) and `/predict`, both the cat JPEG as a multipart upload at 8 clients, in ABBA rounds
(`bench.paired`). On the first, layer4's plan is built before the rounds start (the record keeps the model's
INFO `capture_plans` after them, which shows how many capture batches each engine served).

    .venv/bin/python -m bench.capture_plans --rounds 3 --window 5
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from bench.configs import DEFAULT
from bench.loadgen import LoadResult, measure
from bench.paired import Log, Pair, Side, measure_pair
from bench.payloads import Payload
from bench.run import conv_layers
from bench.server import Server, ServerConfig, free_port
from bench.workload import Inputs, Kind, build_payloads, make_inputs

MODEL, CLIENTS = "resnet18", 8
PAIR = Pair(
    f"{MODEL} /activations layer4 reduce=mean / /predict, JPEG, {CLIENTS} clients",
    Side(Kind.ACTIVATIONS_L4_JPEG, CLIENTS),
    Side(Kind.PREDICT_JPEG_MULTIPART, CLIENTS),
    "images_per_s",
    0.9,
    True,
)
CONFIGS = {
    "plans": replace(DEFAULT.config, name="capture-plans"),
    "hooks": replace(DEFAULT.config, name="hooks-only", env=DEFAULT.config.env | {"HOOKSERVE_CAPTURE_PLANS": "0"}),
}


def plans_info(url: str) -> dict[str, Any]:
    info: dict[str, Any] = httpx.get(f"{url}/models/{MODEL}", timeout=30).json()["capture_plans"]
    return info


def wait_for_plan(url: str, payload: Payload, log: Log, timeout_s: float = 120.0) -> None:
    """Send the capture until its plan is built (or refused, or plans are off)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = plans_info(url)
        if not info["enabled"] or info["plans"] or info["fallbacks"]:
            log(f"  capture plans: {info['plans'] or info['fallbacks'] or info['reason']}")
            return
        measure(url, payload, 1, max_requests=4, max_seconds=2.0, warmup_requests=0, warmup_seconds=0.0)
    raise TimeoutError("layer4's capture plan was not built")


def measure_config(
    cfg: ServerConfig, inputs: Inputs, workdir: Path, log: Log, *, rounds: int, window_s: float, warmup_s: float
) -> dict[str, Any]:
    with Server(cfg, free_port(), workdir) as server:
        built = build_payloads(inputs, conv_layers(server.url))
        wait_for_plan(server.url, built[Kind.ACTIVATIONS_L4_JPEG], log)

        def window(which: str, side: Side) -> LoadResult:
            payload = built[side.kind]
            return measure(
                server.url, payload, side.clients, max_seconds=window_s, warmup_seconds=warmup_s, server_pid=server.pid
            )

        record = measure_pair(PAIR, window, rounds, 5.0, log)
        record["capture_plans"] = plans_info(server.url)
    shown = ", ".join(f"{r['ratio']:.3f}" for r in record["rounds"])
    log(f"  {cfg.name}: {PAIR.name}: {shown}; median {record['ratio']:.3f}")
    return record


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--window", type=float, default=8.0, help="seconds of each window")
    ap.add_argument("--warmup", type=float, default=2.0, help="seconds of warm-up before each window")
    args = ap.parse_args(argv)
    log: Log = lambda line: print(line, flush=True)  # noqa: E731
    inputs = make_inputs()
    with tempfile.TemporaryDirectory(prefix="hookserve-capture-plans-") as tmp:
        records = {
            name: measure_config(
                cfg, inputs, Path(tmp), log, rounds=args.rounds, window_s=args.window, warmup_s=args.warmup
            )
            for name, cfg in CONFIGS.items()
        }
    json.dump(records, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
