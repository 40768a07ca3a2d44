"""`--gpu`: resnet50 in bfloat16 on CUDA, raw torch beside hookserve at 1 and 64 clients (RESULTS_GPU.md).

Also issue 12's `/activations` of one layer (reduced) at 64 clients, against `/predict` at 64.
On a machine without CUDA it says so and measures nothing.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench import raw_torch
from bench.baseline import head_commit
from bench.loadgen import LoadResult, format_result, measure
from bench.machine import machine_info, package_versions, wait_idle
from bench.multiload import measure_processes
from bench.payloads import Payload
from bench.report import comparison_table, introspection_targets, render_markdown, targets_table
from bench.server import Server, ServerConfig, free_port
from bench.workload import LABELS, Inputs, Kind, build_payloads, make_inputs

GPU_TOML = """\
[[models]]
name = "resnet50"
source = "torchvision"
architecture = "resnet50"
dtype = "bfloat16"
device = "cuda"
"""
CLIENTS = 64
POINTS: dict[tuple[Kind, int], str] = {  # point -> its raw counterpart
    (Kind.PREDICT_JPEG_MULTIPART, 1): "gpu-e2e-b1",
    (Kind.PREDICT_JPEG_MULTIPART, CLIENTS): "gpu-e2e-b64",
    (Kind.PREDICT_TENSOR, 1): "gpu-forward-b1",
    (Kind.PREDICT_TENSOR, CLIENTS): "gpu-forward-b64",
    (Kind.ACTIVATIONS_L4_JPEG, CLIENTS): "gpu-e2e-b64",  # issue 12: >= 0.7 x /predict JPEG at 64 clients
}
MODEL = "resnet50"


def gpu_payloads(inputs: Inputs) -> dict[Kind, Payload]:
    """The request of every kind POINTS measures, for resnet50 (no Conv2d list needed: no all-Conv2d point)."""
    payloads = build_payloads(inputs, [], model=MODEL)
    return {kind: payloads[kind] for kind, _ in POINTS}


def gpu_config(cores: int) -> ServerConfig:
    """Decode on half the cores (the load generator gets the rest), batches of up to 64."""
    decode = max(1, cores // 2)
    return ServerConfig(
        "gpu",
        f"resnet50 bfloat16 on cuda; 2 executor threads x 1 torch thread, {decode} decode threads, batch 64, 5 ms",
        {
            "HOOKSERVE_WORKER_THREADS": "2",
            "HOOKSERVE_TORCH_THREADS": "1",
            "HOOKSERVE_DECODE_THREADS": str(decode),
            "HOOKSERVE_MAX_BATCH_SIZE": str(CLIENTS),
            "HOOKSERVE_MAX_BATCH_DELAY_MS": "5",
        },
        GPU_TOML,
    )


def main(args: argparse.Namespace, log: Callable[[str], None]) -> int:
    if not torch.cuda.is_available():
        log("no CUDA device here: --gpu (resnet50 bfloat16 at 64 clients) needs one; nothing was measured")
        return 0
    cores = os.cpu_count() or 1
    cfg = gpu_config(cores)
    inputs = make_inputs()
    loaders = max(1, min(8, cores // 4))
    results: dict[str, Any] = {
        "started_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": "python -m bench.run --gpu",
        "machine": machine_info(),
        "versions": package_versions(),
        "input": inputs.describe(),
        "load": f"closed loop over {loaders} load-generator process(es) at {CLIENTS} clients (one at 1 client), "
        f"min({args.duration:g} s, {args.requests} requests) per point after a warm-up",
        "configs": {cfg.name: {"description": cfg.description, "env": cfg.env, "commit": head_commit()}},
        "raw": {},
        "points": [],
    }
    bf16 = torch.bfloat16
    if not args.skip_raw:
        decode = int(cfg.env["HOOKSERVE_DECODE_THREADS"])
        for key, mode, batch in (
            ("gpu-forward-b1", "forward", 1),
            ("gpu-forward-b64", "forward", CLIENTS),
            ("gpu-e2e-b1", "e2e", 1),
            ("gpu-e2e-b64", "e2e", CLIENTS),
        ):
            wait_idle(args.idle_wait, log=log)
            r = raw_torch.run_raw(
                "resnet50",
                mode,
                batch=batch,
                threads=1,
                jpeg=inputs.jpeg,
                seconds=args.raw_duration,
                warmup=5,
                device="cuda",
                dtype=bf16,
                decode_threads=decode,
            )
            log(f"{r.name}: {r.images_per_s:.1f} images/s, batch p50 {r.lat_ms['p50']:.1f} ms")
            results["raw"][key] = r.to_dict()
        torch.cuda.empty_cache()
    port = args.port or free_port()
    with tempfile.TemporaryDirectory(prefix="hookserve-bench-gpu-") as tmp, Server(cfg, port, Path(tmp)) as server:
        payloads = gpu_payloads(inputs)
        for (kind, clients), raw_key in POINTS.items():
            wait_idle(args.idle_wait, log=log)
            result: LoadResult
            if clients == 1:
                result = measure(
                    server.url,
                    payloads[kind],
                    1,
                    max_requests=args.requests,
                    max_seconds=args.duration,
                    server_pid=server.pid,
                    client=args.client,
                )
            else:
                result = measure_processes(
                    server.url,
                    payloads[kind],
                    clients,
                    loaders,
                    max_requests=args.requests * 4,
                    max_seconds=args.duration,
                    server_pid=server.pid,
                    client=args.client,
                )
            log(f"  gpu: {format_result(result)}")
            results["points"].append(
                {
                    "config": cfg.name,
                    "kind": kind.value,
                    "label": LABELS[kind].replace("resnet18", MODEL),
                    "concurrency": clients,
                    "baseline": raw_key,
                    "attempt": 1,
                    "result": result.to_dict(),
                }
            )
    results["finished_utc"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    print(comparison_table(results))
    print(targets_table(introspection_targets(results)))
    if args.out is not None:
        args.out.write_text(render_markdown(results, "hookserve benchmark on a GPU: resnet50 bfloat16"))
        log(f"wrote {args.out}")
    return 0
