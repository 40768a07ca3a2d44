"""Occlusion with its defaults on resnet18: seconds per forward on the prediction path's copy against the commit
before it ran there (its forwards on the hooked eager module), and the time estimate against the time taken.

Two `default` servers over the built-in registry, one of this checkout and one of `--before` (a temporary
worktree, `bench.baseline`), up at the same time; the cat JPEG uploaded to resnet18's `/saliency` with
`method=occlusion` and nothing else (the page's request), one client, in ABBA rounds so that both sides meet the
same machine. Each side's `dry_run` gives the forwards the request runs and the seconds the server expects, before
the first request and again after the rounds (the server corrects its estimates by what requests took); the
per-forward ratio is before / now (above 1: the prediction path is faster).

    .venv/bin/python -m bench.occlusion [--before REF] [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from bench import baseline
from bench.configs import DEFAULT
from bench.machine import machine_info, wait_idle
from bench.server import Server, free_port
from bench.workload import make_inputs

MODEL = "resnet18"
FIELDS = {"model": MODEL, "method": "occlusion"}
DEFAULT_BEFORE = "e36200f"  # the last commit whose occlusion forwards ran on the hooked eager module
TARGET = 1.3  # per-forward speed-up of the default occlusion on resnet18


def post(url: str, jpeg: bytes, **extra: str) -> httpx.Response:
    files = {"image": ("chelsea.jpg", jpeg, "image/jpeg")}
    response = httpx.post(f"{url}/saliency", data=FIELDS | extra, files=files, timeout=600)
    response.raise_for_status()
    return response


def estimate(url: str, jpeg: bytes) -> dict[str, Any]:
    """The server's dry run of the request: forwards and expected seconds."""
    answer: dict[str, Any] = post(url, jpeg, dry_run="true").json()
    return answer


def timed(url: str, jpeg: bytes) -> float:
    started = time.perf_counter()
    post(url, jpeg, format="json")
    return time.perf_counter() - started


def run(before_ref: str, rounds: int, idle_wait_s: float, workdir: Path) -> dict[str, Any]:
    jpeg = make_inputs().jpeg
    off = {"HOOKSERVE_GRPC_PORT": "off", "HOOKSERVE_TORCHSERVE_MANAGEMENT_PORT": "off"}  # two servers at once
    config = replace(DEFAULT.config, name="occlusion", env=DEFAULT.config.env | off)
    with (
        baseline.checkout(before_ref, workdir) as before,
        Server(config, free_port(), workdir / "now") as now_server,
        Server(replace(config, name="occlusion-before"), free_port(), workdir / "before", source=before.path) as old,
    ):
        sides = {"now": now_server.url, "before": old.url}
        plans = {name: estimate(url, jpeg) for name, url in sides.items()}
        path = httpx.get(f"{now_server.url}/models/{MODEL}", timeout=30).json().get("prediction_path")
        for url in sides.values():
            timed(url, jpeg)  # warm: first-use allocations, the lanes' packed weights
        seconds: dict[str, list[float]] = {name: [] for name in sides}
        for i in range(rounds):
            order = ["now", "before"] if i % 2 == 0 else ["before", "now"]
            for name in order:
                wait_idle(idle_wait_s, log=lambda _: None)
                seconds[name].append(timed(sides[name], jpeg))
                print(f"  round {i + 1} {name}: {seconds[name][-1]:.2f} s", flush=True)
        calibrated = {name: estimate(url, jpeg) for name, url in sides.items()}  # after the server's own correction
    per_forward = {name: statistics.median(s) / plans[name]["forwards"] for name, s in seconds.items()}
    return {
        "machine": machine_info(),
        "before": {"ref": before.ref, "commit": before.commit},
        "prediction_path": path,
        "forwards": {name: plan["forwards"] for name, plan in plans.items()},
        "estimate_s": {name: plan.get("seconds") for name, plan in plans.items()},
        "seconds": seconds,
        "per_forward_ms": {name: 1000 * value for name, value in per_forward.items()},
        "speedup": per_forward["before"] / per_forward["now"],
        "estimate_over_measured": {
            name: plans[name]["seconds"] / statistics.median(taken)
            for name, taken in seconds.items()
            if plans[name].get("seconds")
        },
        "calibrated_estimate_over_measured": {
            name: calibrated[name]["seconds"] / statistics.median(taken)
            for name, taken in seconds.items()
            if calibrated[name].get("seconds")
        },
        "target": TARGET,
    }


def ratios(by_side: dict[str, float]) -> str:
    return ", ".join(f"{side} {value:.2f}" for side, value in by_side.items())


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--before", default=DEFAULT_BEFORE, help=f"the commit to compare with (default {DEFAULT_BEFORE})")
    ap.add_argument("--rounds", type=int, default=4, help="ABBA rounds (default 4)")
    ap.add_argument("--idle-wait", type=float, default=60.0, help="at most this long for an idle machine per run")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hookserve-occlusion-") as tmp:
        record = run(args.before, args.rounds, args.idle_wait, Path(tmp))
    verdict = "pass" if record["speedup"] >= TARGET else "fail"
    print(
        f"occlusion defaults on {MODEL}: {record['forwards']['now']} forwards; per forward "
        f"{record['per_forward_ms']['before']:.1f} ms before, {record['per_forward_ms']['now']:.1f} ms now "
        f"({record['prediction_path']}): {record['speedup']:.2f} x (target >= {TARGET}: {verdict}); "
        f"estimate / measured, first: {ratios(record['estimate_over_measured'])}; "
        f"after the rounds: {ratios(record['calibrated_estimate_over_measured'])}"
    )
    json.dump(record, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
