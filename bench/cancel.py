"""How soon a long request's work stops after its client leaves: integrated gradients on resnet18 (the cat JPEG,
`steps` from `--steps`, far longer than the wait), the client gone after `--after` seconds, and the server's CPU
watched until it is idle.

A `default` server over the built-in registry. Each try posts the request, closes the connection at `--after` s
(the client's read timeout), then samples the server process's CPU time every 20 ms: the work has stopped at the
first sample after which the server used under 0.1 cores for 300 ms. The time from the disconnect to that sample
is printed per try, with its median and maximum; the server's `chunk_seconds` bounds how long one chunk of rows
runs between checks (the target: within 1 s).

    .venv/bin/python -m bench.cancel [--tries N] [--steps N] [--after S]
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
import psutil

from bench.configs import DEFAULT
from bench.machine import machine_info, wait_idle
from bench.server import Server, free_port
from bench.workload import make_inputs

MODEL = "resnet18"
SAMPLE_S = 0.02
QUIET_S = 0.3
QUIET_CORES = 0.1
TARGET_S = 1.0


def stopped_after(process: psutil.Process, limit_s: float = 60.0) -> float:
    """Seconds from now until the first sample after which `process` stays under QUIET_CORES for QUIET_S."""
    start = time.perf_counter()
    samples: list[tuple[float, float]] = []  # (time since start, CPU seconds)
    while time.perf_counter() - start < limit_s:
        cpu = process.cpu_times()
        samples.append((time.perf_counter() - start, cpu.user + cpu.system))
        quiet_from = [i for i, (t, _) in enumerate(samples) if samples[-1][0] - t >= QUIET_S]
        if quiet_from:
            i = quiet_from[-1]
            t0, c0 = samples[i]
            t1, c1 = samples[-1]
            if (c1 - c0) / (t1 - t0) < QUIET_CORES:
                return t0
        time.sleep(SAMPLE_S)
    raise SystemExit(f"the server was still busy {limit_s:g} s after the client left")


def one_try(url: str, process: psutil.Process, jpeg: bytes, steps: int, after_s: float) -> float:
    files = {"image": ("chelsea.jpg", jpeg, "image/jpeg")}
    data = {"model": MODEL, "method": "integrated_gradients", "steps": str(steps), "format": "json"}
    try:
        httpx.post(f"{url}/saliency", data=data, files=files, timeout=after_s)
    except httpx.TimeoutException:
        pass  # the client leaves: httpx closes the connection
    else:
        raise SystemExit(f"the request finished within {after_s:g} s: raise --steps")
    return stopped_after(process)


def run(tries: int, steps: int, after_s: float, idle_wait_s: float, workdir: Path) -> dict[str, Any]:
    jpeg = make_inputs().jpeg
    with Server(replace(DEFAULT.config, name="cancel"), free_port(), workdir) as server:
        url = server.url
        files = {"image": ("chelsea.jpg", jpeg, "image/jpeg")}
        plan = httpx.post(
            f"{url}/saliency",
            data={"model": MODEL, "method": "integrated_gradients", "steps": str(steps), "dry_run": "true"},
            files=files,
            timeout=60,
        ).json()
        process = psutil.Process(server.pid)
        stops = []
        for i in range(tries):
            wait_idle(idle_wait_s, log=lambda _: None)
            stops.append(one_try(url, process, jpeg, steps, after_s))
            print(f"  try {i + 1}: stopped {stops[-1]:.2f} s after the client left", flush=True)
        alive = httpx.get(f"{url}/healthz", timeout=30).status_code
    return {
        "machine": machine_info(),
        "model": MODEL,
        "steps": steps,
        "after_s": after_s,
        "estimate": {k: plan.get(k) for k in ("forwards", "backwards", "seconds", "rows_per_forward")},
        "stopped_after_s": stops,
        "median_s": statistics.median(stops),
        "max_s": max(stops),
        "healthz_after": alive,
        "target_s": TARGET_S,
    }


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--tries", type=int, default=5)
    ap.add_argument("--steps", type=int, default=256, help="integrated gradients steps (a long request)")
    ap.add_argument("--after", type=float, default=3.0, help="seconds before the client leaves")
    ap.add_argument("--idle-wait", type=float, default=60.0, help="at most this long for an idle machine per try")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hookserve-cancel-") as tmp:
        record = run(args.tries, args.steps, args.after, args.idle_wait, Path(tmp))
    verdict = "pass" if record["max_s"] <= TARGET_S else "fail"
    print(
        f"{MODEL} integrated gradients, {args.steps} steps (estimated {record['estimate']['seconds']} s), client gone "
        f"after {args.after:g} s: work stopped after median {record['median_s']:.2f} s, max {record['max_s']:.2f} s "
        f"(target <= {TARGET_S:g} s: {verdict})"
    )
    json.dump(record, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
