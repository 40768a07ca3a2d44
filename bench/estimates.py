"""How good a request's cost estimate is before the work: memory (peak / estimate) and time (taken / estimate).

A fixed zoo of requests over the built-in registry: every model-running endpoint, odd input shapes, JSON and
binary answers, three models. Each request runs alone on a freshly started server (the built-in registry,
default settings), so no memory another request freed and the allocator kept can hide its own, and its time
estimate is the first one a server gives (from the per-row times measured at load, before any request
corrected them). For each: the `dry_run` answer (bytes, seconds), then the request itself, timed by the
client, with the server's peak resident memory (`VmHWM`, reset just before through `/proc/<pid>/clear_refs`)
above its resident memory just before.

Targets: peak / estimate within [0.5, 1.5] for every request estimated over 64 MiB; taken / estimate within
[0.5, 2] for the slow methods (those estimated over 2 s).

    .venv/bin/python -m bench.estimates            # ~8 min: writes bench/RESULTS_ESTIMATES.md
"""

from __future__ import annotations

import argparse
import base64
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.baseline import git
from bench.machine import machine_info, wait_idle
from bench.server import REPO, Server, ServerConfig, free_port

MIB = 1024**2
MEMORY_BOUNDS = (0.5, 1.5)
MEMORY_FROM = 64 * MIB
TIME_BOUNDS = (0.5, 2.0)
TIME_FROM = 2.0  # seconds: the slow methods
BUILT_IN = ServerConfig("built-in", "the built-in registry, default settings")


def tensors(n: int, shape: Sequence[int], seed: int = 0) -> list[dict[str, Any]]:
    """`n` float32 tensor inputs of `shape`, base64 (uniform in [0, 1), seeded)."""
    rng = np.random.default_rng(seed)
    found = []
    for _ in range(n):
        data = rng.random(tuple(shape), dtype=np.float32).tobytes()
        found.append({"tensor": {"shape": list(shape), "dtype": "float32", "b64": base64.b64encode(data).decode()}})
    return found


@dataclass(frozen=True)
class Case:
    name: str
    path: str
    body: dict[str, Any]


R18 = [3, 224, 224]
CASES = [
    Case(
        "resnet18 /activations every layer, both sides, safetensors, 4 inputs",
        "/activations",
        {"model": "resnet18", "inputs": tensors(4, R18), "layers": ["*"], "capture": "both", "format": "safetensors"},
    ),
    Case(
        "resnet18 /activations of the stem and layer1, JSON, 1 input",
        "/activations",
        {"model": "resnet18", "inputs": tensors(1, R18), "layers": ["conv1", "bn1", "relu", "maxpool", "layer1"]},
    ),
    Case(
        "resnet18 /activations every layer, safetensors, a 3 x 97 x 611 input",
        "/activations",
        {"model": "resnet18", "inputs": tensors(1, [3, 97, 611]), "layers": ["*"], "format": "safetensors"},
    ),
    Case(
        "resnet18 /gradients layer1 and layer4, safetensors, 2 inputs",
        "/gradients",
        {"model": "resnet18", "inputs": tensors(2, R18), "layers": ["layer1", "layer4"], "format": "safetensors"},
    ),
    Case(
        "resnet18 /saliency integrated_gradients, 64 steps",
        "/saliency",
        {"model": "resnet18", "inputs": tensors(1, R18), "method": "integrated_gradients", "steps": 64},
    ),
    Case(
        "resnet18 /saliency occlusion, its defaults",
        "/saliency",
        {"model": "resnet18", "inputs": tensors(1, R18), "method": "occlusion"},
    ),
    Case(
        "resnet18 /saliency layer_conductance on layer3, its defaults",
        "/saliency",
        {"model": "resnet18", "inputs": tensors(1, R18), "method": "layer_conductance", "layer": "layer3"},
    ),
    Case(
        "resnet18 /interventions/sweep of layer4, 512 channels",
        "/interventions/sweep",
        {"model": "resnet18", "inputs": tensors(1, R18), "site": "layer4"},
    ),
    Case(
        "efficientvit_b0 /activations of every module in stages_0 and stages_1, both sides, safetensors, 2 inputs",
        "/activations",
        {
            "model": "efficientvit_b0",
            "inputs": tensors(2, R18),
            "layers": ["stages_0*", "stages_1*"],
            "capture": "both",
            "format": "safetensors",
        },
    ),
    Case(
        "lenet /activations every layer, both sides, safetensors, 64 inputs",
        "/activations",
        {
            "model": "lenet",
            "inputs": tensors(64, [3, 32, 32]),
            "layers": ["*"],
            "capture": "both",
            "format": "safetensors",
        },
    ),
]


def resident(pid: int, field: str) -> int:
    """`VmRSS` or `VmHWM` of a process, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def measure_case(case: Case, workdir: Path, log: Callable[[str], None]) -> dict[str, Any]:
    with Server(BUILT_IN, free_port(), workdir) as server, httpx.Client(base_url=server.url, timeout=600) as client:
        dry = client.post(case.path, json={**case.body, "dry_run": True})
        if dry.status_code != 200:
            raise RuntimeError(f"{case.name}: the dry run answered {dry.status_code} {dry.text[:300]}")
        estimate = dry.json()
        wait_idle(60.0, log=log)
        before = resident(server.pid, "VmRSS")
        Path(f"/proc/{server.pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
        started = time.perf_counter()
        response = client.post(case.path, json=case.body)
        taken = time.perf_counter() - started
        peak = resident(server.pid, "VmHWM") - before
    if response.status_code != 200:
        raise RuntimeError(f"{case.name}: {response.status_code} {response.text[:300]}")
    row = {
        "name": case.name,
        "estimate_bytes": int(estimate["memory"]["bytes"]),
        "peak_bytes": peak,
        "estimate_s": float(estimate["seconds"]),
        "taken_s": taken,
        "forwards": estimate["forwards"],
        "answer_bytes": len(response.content),
    }
    log(
        f"{case.name}: estimate {row['estimate_bytes'] / MIB:.0f} MiB, peak +{peak / MIB:.0f} MiB; "
        f"estimate {row['estimate_s']:.2f} s, took {taken:.2f} s"
    )
    return row


def verdict(ratio: float, bounds: tuple[float, float]) -> str:
    return "pass" if bounds[0] <= ratio <= bounds[1] else "FAIL"


def markdown(rows: list[dict[str, Any]], commit: str) -> str:
    lines = [
        "# Cost estimates against what requests took",
        "",
        f"Run {datetime.now(UTC).isoformat(timespec='seconds')} ({commit}), `python -m bench.estimates`: each "
        "request alone on a freshly started server (the built-in registry, default settings). Machine: "
        + ", ".join(f"{k} {v}" for k, v in machine_info().items())
        + ".",
        "",
        f"Memory: the server's peak resident memory above its resident memory just before the request, over the "
        f"dry run's estimate; target within [{MEMORY_BOUNDS[0]}, {MEMORY_BOUNDS[1]}] for requests estimated over "
        f"{MEMORY_FROM // MIB} MiB. Time: the request's time as its client saw it over the estimate (the first a "
        f"server gives, from the per-row times measured at load); target within [{TIME_BOUNDS[0]}, "
        f"{TIME_BOUNDS[1]}] for requests estimated over {TIME_FROM:g} s.",
        "",
        "| request | estimate MiB | peak MiB | peak / estimate | | estimate s | took s | took / estimate | |",
        "|---|---:|---:|---:|---|---:|---:|---:|---|",
    ]
    for r in rows:
        memory = r["peak_bytes"] / r["estimate_bytes"]
        time_ratio = r["taken_s"] / r["estimate_s"] if r["estimate_s"] > 0 else float("nan")
        judged_memory = verdict(memory, MEMORY_BOUNDS) if r["estimate_bytes"] > MEMORY_FROM else "-"
        judged_time = verdict(time_ratio, TIME_BOUNDS) if r["estimate_s"] > TIME_FROM else "-"
        lines.append(
            f"| {r['name']} | {r['estimate_bytes'] / MIB:.0f} | {r['peak_bytes'] / MIB:.0f} | {memory:.2f} | "
            f"{judged_memory} | {r['estimate_s']:.2f} | {r['taken_s']:.2f} | {time_ratio:.2f} | {judged_time} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.estimates", description=__doc__)
    parser.add_argument("--only", default="", help="run the cases whose name contains this")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "RESULTS_ESTIMATES.md")
    args = parser.parse_args(argv)

    def log(line: str) -> None:
        print(line, flush=True)

    rows = []
    with tempfile.TemporaryDirectory(prefix="hookserve-bench-estimates-") as tmp:
        for i, case in enumerate(c for c in CASES if args.only in c.name):
            rows.append(measure_case(case, Path(tmp) / f"case{i}", log))
    commit = git(REPO, "rev-parse", "--short", "HEAD")
    text = markdown(rows, commit)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
